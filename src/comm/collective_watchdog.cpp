#include "ddp/comm/collective_watchdog.hpp"

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
  thread_ = std::thread([this] { loop(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CollectiveWatchdog::watch(c10::intrusive_ptr<c10d::Work> work) {
  // isCompleted() polls an event (NCCL) or a flag (Gloo); a failed work counts as completed
  // here: its waiter reports the failure.
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
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  works_.emplace_back(std::move(watched), now);
}

size_t CollectiveWatchdog::watched() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return works_.size();
}

void CollectiveWatchdog::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [this] { return works_.empty() || expired_ran_; });
}

void CollectiveWatchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, poll_, [this] { return stop_; })) {
    std::string error;
    while (!works_.empty() && works_.front().first.finished(&error) && error.empty()) {
      works_.pop_front();
    }
    if (works_.empty()) {
      idle_cv_.notify_all();
      continue;
    }
    const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - works_.front().second);
    if (error.empty() && age < timeout_) continue;
    const Watched expired = works_.front().first;
    lock.unlock();
    expired_(expired, age,
             error);  // ProcessGroup's ends the process; one that returns ends the watch
    lock.lock();
    expired_ran_ = true;
    idle_cv_.notify_all();
    return;
  }
}

}  // namespace ddp::comm
