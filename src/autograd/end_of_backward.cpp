#include "ddp/autograd/end_of_backward.hpp"

#include <torch/csrc/autograd/engine.h>

#include <exception>
#include <memory>
#include <mutex>
#include <vector>

namespace ddp::autograd {

namespace {

// The one pending list. `token` is held by the queued engine callback: expired means the engine
// dropped that callback without running it (its backward failed).
struct Pending {
  std::mutex mutex;
  std::vector<std::function<void()>> fns;  // asked for in the backward now running
  std::weak_ptr<int> token;                // the queued callback's; expired: none queued
};

Pending& pending() {
  static Pending p;
  return p;
}

void run_pending() {
  Pending& p = pending();
  std::vector<std::function<void()>> fns;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    fns.swap(p.fns);
    p.token.reset();  // a request from here on (another backward) queues anew
  }
  std::exception_ptr failure;
  for (auto& fn : fns) {
    try {
      fn();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

void at_end_of_backward(std::function<void()> fn) {
  Pending& p = pending();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.token.expired()) {
    p.fns.clear();  // a failed backward's list: its engine callback is gone
    auto token = std::make_shared<int>(0);
    p.token = token;
    // The callback holds the token: it lives exactly as long as the engine keeps the callback.
    torch::autograd::Engine::get_default_engine().queue_callback([token] { run_pending(); });
  }
  p.fns.push_back(std::move(fn));
}

}  // namespace ddp::autograd
