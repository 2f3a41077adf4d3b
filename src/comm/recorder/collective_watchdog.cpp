#include "ddp/comm/recorder/collective_watchdog.hpp"

#include <c10/util/Exception.h>

#include <exception>

namespace ddp::comm {

CollectiveWatchdog::CollectiveWatchdog(std::chrono::milliseconds timeout,
                                       std::chrono::milliseconds poll, Expired expired)
    : timeout_(timeout), poll_(poll), expired_(std::move(expired)) {
  TORCH_CHECK(timeout_.count() > 0 && poll_.count() > 0,
              "ddp: CollectiveWatchdog needs a positive timeout and poll interval, got ",
              timeout_.count(), " ms and ", poll_.count(), " ms");
  TORCH_CHECK(expired_, "ddp: CollectiveWatchdog needs an expiry action");
  poller_ = std::thread([this] { poll_loop(); });
  clock_ = std::thread([this] { clock_loop(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  tick_cv_.notify_all();
  if (clock_.joinable()) clock_.join();
  // The poller exits at its next wake-up. It is not stuck in a query here: the group's
  // destructor waits for every watched collective first (wait_idle), or the process has ended.
  if (poller_.joinable()) poller_.join();
}

void CollectiveWatchdog::watch(c10::intrusive_ptr<c10d::Work> work) {
  auto polled = work;
  watch(Watched{[polled](std::string* error) {
                  if (!polled->isCompleted()) return false;
                  if (const std::exception_ptr failure = polled->exception()) {
                    try {
                      std::rethrow_exception(failure);
                    } catch (const std::exception& e) {
                      *error = e.what();
                    } catch (...) {
                      *error = "an unknown error";
                    }
                  }
                  return true;
                },
                std::move(work), "a collective"});
}

void CollectiveWatchdog::watch(Watched watched) {
  auto entry = std::make_shared<Entry>(Entry{std::move(watched), std::chrono::steady_clock::now()});
  std::lock_guard<std::mutex> lock(mutex_);
  works_.push_back(std::move(entry));
}

size_t CollectiveWatchdog::watched() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return works_.size();
}

void CollectiveWatchdog::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [this] { return works_.empty() || expired_ran_; });
}

bool CollectiveWatchdog::wait_tick(std::unique_lock<std::mutex>& lock) {
  return !tick_cv_.wait_for(lock, poll_, [this] { return stop_; });
}

void CollectiveWatchdog::poll_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (wait_tick(lock)) {
    // Drops the finished entries from the front; stops at the first one still running. The
    // query runs without the lock: it may block (see the class comment), and watch() must not.
    while (!works_.empty() && !failed_ && !expired_ran_ && !stop_) {
      std::shared_ptr<Entry> front = works_.front();
      lock.unlock();
      std::string error;
      bool finished = true;
      try {
        finished = front->watched.finished(&error);
      } catch (const std::exception&) {
        // The query itself failed (a device error, a context already torn down at exit): the
        // thread waiting on the device sees that error itself; nothing is left to time here.
        finished = true;
        error.clear();
      }
      lock.lock();
      if (finished && !error.empty()) {
        failed_ = front;
        failure_ = error;
      } else if (finished && !works_.empty() && works_.front() == front) {
        works_.pop_front();
      }
      // The entry goes without the lock: its last reference may be this one, and destroying
      // what it holds (a CUDA event) can block while the device is stuck behind a collective
      // that never ends; under the lock that stopped the clock thread, so a SIGSTOPped peer
      // went unnamed until c10d's abort (2x H200, 2026-11-27).
      lock.unlock();
      front.reset();
      lock.lock();
      if (!finished || failed_) break;
    }
    if (works_.empty()) idle_cv_.notify_all();
  }
}

void CollectiveWatchdog::clock_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (wait_tick(lock)) {
    std::shared_ptr<Entry> expired = failed_;
    const std::string error = failure_;
    const auto now = std::chrono::steady_clock::now();
    if (!expired && !works_.empty() && now - works_.front()->since >= timeout_) {
      expired = works_.front();
    }
    if (!expired) continue;
    const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - expired->since);
    lock.unlock();
    expired_(expired->watched, age, error);  // ProcessGroup's ends the process
    lock.lock();
    expired_ran_ = true;  // an action that returns ends the watch
    idle_cv_.notify_all();
    return;
  }
}

}  // namespace ddp::comm
