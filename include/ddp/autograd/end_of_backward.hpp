#pragma once
// [Note: one end-of-backward callback] Everything of libddp that must act once a backward has
// finished (the gradient runtime finishing its buckets, the sharded runtime moving parameters back
// to their shards, tensor parallelism counting its forwards down) asks here, and the engine gets
// ONE callback per backward: the first request in a backward queues it, later requests join its
// list, and at the end the functions run in the order they were asked for, on the thread that
// finishes the backward. So the order of the end-of-backward work is written in one place (the
// callers' order of asking), not left to how many engine callbacks happen to be queued.
//
// A backward that fails never runs its engine callbacks; the engine then destroys them, which this
// notices at the next request (the queued callback's token is gone) and starts a new list instead
// of joining a list that will never run.

#include <functional>

namespace ddp::autograd {

// From inside a backward (a hook or a node's backward): runs `fn` once the engine has finished the
// current graph task, after the functions asked for before it in this backward. If one throws, the
// rest still run and the first error is rethrown (it becomes backward's error).
void at_end_of_backward(std::function<void()> fn);

}  // namespace ddp::autograd
