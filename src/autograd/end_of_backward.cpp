#include "ddp/autograd/end_of_backward.hpp"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include <exception>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace ddp::autograd {

namespace {

// A graph task's identity while it runs: the address of its exec_info map, a member of the task
// (the engine's only public handle on the current task in every torch this builds against). An
// address reused by a later task is harmless: a finished task's list is gone, a failed one's
// token expired.
using Task = const void*;

Task current_task() { return torch::autograd::get_current_graph_task_exec_info(); }

// The outer task whose list requests on this thread join (set by NestedBackward), or null.
thread_local Task t_outer = nullptr;

struct List {
  std::vector<std::function<void()>> fns;  // asked for in this task, in order
  std::weak_ptr<int> token;                // the queued callback's; expired: none queued
};

// Every open list by its task. Invariant: a live token's entry is the list its task's engine
// callback will run; entries with an expired token belong to failed backwards and are dropped at
// the next list opened.
struct Lists {
  std::mutex mutex;
  std::unordered_map<Task, List> by_task;
};

Lists& lists() {
  static Lists l;
  return l;
}

void run_list(Task task) {
  Lists& l = lists();
  std::vector<std::function<void()>> fns;
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    const auto it = l.by_task.find(task);
    if (it == l.by_task.end()) return;
    fns.swap(it->second.fns);
    l.by_task.erase(it);  // a request from here on (another backward) opens a new list
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

// The open list of `task`, opened (its callback queued) when none is; the caller holds the lock.
// Only the running task can queue its callback: a nested request finds its outer list open.
List& open_list(Lists& l, Task task) {
  const auto found = l.by_task.find(task);
  if (found != l.by_task.end() && !found->second.token.expired()) return found->second;
  TORCH_INTERNAL_ASSERT(task == current_task(),
                        "ddp: the outer backward's end-of-backward list closed while a nested "
                        "backward still runs");
  for (auto it = l.by_task.begin(); it != l.by_task.end();) {
    it = it->second.token.expired() ? l.by_task.erase(it) : std::next(it);
  }
  auto token = std::make_shared<int>(0);
  // The callback holds the token: it lives exactly as long as the engine keeps the callback.
  torch::autograd::Engine::get_default_engine().queue_callback([token, task] { run_list(task); });
  List& list = l.by_task[task];
  list.token = token;
  return list;
}

Task asking_task() {
  const Task task = t_outer != nullptr ? t_outer : current_task();
  TORCH_CHECK(task != nullptr,
              "ddp: at_end_of_backward was called outside a backward (from a hook or a node's "
              "backward only)");
  return task;
}

}  // namespace

void at_end_of_backward(std::function<void()> fn) {
  const Task task = asking_task();
  Lists& l = lists();
  std::lock_guard<std::mutex> lock(l.mutex);
  open_list(l, task).fns.push_back(std::move(fn));
}

NestedBackward::NestedBackward() : saved_(t_outer) {
  if (t_outer != nullptr) return;  // an enclosing one already points at the outermost task
  const Task task = asking_task();
  {
    Lists& l = lists();
    std::lock_guard<std::mutex> lock(l.mutex);
    open_list(l, task);  // queued now, while the outer task is the current one
  }
  t_outer = task;
}

NestedBackward::~NestedBackward() { t_outer = saved_; }

}  // namespace ddp::autograd
