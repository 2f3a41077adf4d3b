#pragma once
// [Note: one end-of-backward callback] Everything of libddp that must act once a backward has
// finished (the gradient runtime finishing its buckets, the sharded runtime moving parameters back
// to their shards, tensor parallelism counting its forwards down) asks here, and the engine gets
// ONE callback per backward: the first request in a backward queues it, later requests join its
// list, and at the end the functions run in the order they were asked for, on the thread that
// finishes the backward. So the order of the end-of-backward work is written in one place (the
// callers' order of asking), not left to how many engine callbacks happen to be queued.
//
// A list belongs to the graph task (one backward() or grad() call) that asked: two backwards
// running at once on two threads keep two lists, each run at its own end. A backward run inside a
// node's backward (a nested graph task) is a backward of its own, unless the node says otherwise
// with a NestedBackward (activation checkpointing's recompute): then its requests join the list
// of the backward that runs the node, and wait for that backward's end.
//
// A backward that fails never runs its engine callbacks; the engine then destroys them, which this
// notices at the next request of that task's list (the queued callback's token is gone) and
// starts a new list instead of joining one that will never run.

#include <functional>

namespace ddp::autograd {

// From inside a backward (a hook or a node's backward): runs `fn` once the engine has finished the
// current graph task (or the outer one, inside a NestedBackward), after the functions asked for
// before it in that backward. If one throws, the rest still run and the first error is rethrown
// (it becomes backward's error). Outside a backward: an error.
void at_end_of_backward(std::function<void()> fn);

// Held by a node's backward around a backward it runs itself: requests made by that inner
// backward on this thread join the list of the backward running the node. The inner graph runs on
// this thread when its tensors are on the node's device (the engine runs a nested task on the
// calling worker); requests from nodes on another device's thread form their own list.
class NestedBackward {
 public:
  NestedBackward();  // inside a backward: opens the outer backward's list if none is open
  ~NestedBackward();
  NestedBackward(const NestedBackward&) = delete;
  NestedBackward& operator=(const NestedBackward&) = delete;

 private:
  const void* saved_;  // the outer task of an enclosing NestedBackward on this thread, or null
};

}  // namespace ddp::autograd
