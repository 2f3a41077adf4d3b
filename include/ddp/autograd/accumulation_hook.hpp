#pragma once
// [Note: a leaf's hook runs once per accumulation] libddp's sharded styles and tensor parallelism
// watch a parameter's gradient with a tensor hook ([Note: hooks that survive set_]). Such a hook
// runs where the engine accumulates into the parameter's .grad, and also, since libtorch 2.0,
// where a torch::autograd::grad call that lists the parameter among its inputs captures the
// gradient to return it (PyTorch's autograd notes, "Backward hooks execution"; 1.13 does not,
// pytorch#35802). Activation checkpointing's recompute is such a call: it returns the block's
// parameter gradients to its node, and the outer backward then accumulates them. On 2.x a plain
// tensor hook therefore saw every checkpointed parameter twice in one backward, and a sharded
// unit closed at the first sight refused the second (issue 59: FULLY_SHARD with checkpointing
// failed on every CUDA run, never on the 1.13 CPU build).
//
// The hooks registered here run only when the gradient is on its way into .grad: a call from a
// grad() that captures the leaf is skipped. So a parameter is seen once per backward on every
// libtorch, and a user's own torch::autograd::grad over the parameters (which fills no .grad)
// counts as no gradient, as PyTorch's DDP (accumulator post-hooks) treats it.

#include <ATen/core/Tensor.h>

#include <functional>

namespace ddp::autograd {

// True while a backward runs whose torch::autograd::grad call captures `leaf`'s gradient (returns
// it) instead of accumulating it: the running graph task lists the leaf's accumulator as a capture
// it does not execute. False outside a backward, in backward() (with or without inputs), and for a
// tensor that is not a leaf requiring grad.
bool gradient_is_captured(const at::Tensor& leaf);

// Tensor::register_hook on `leaf` (it survives set_() and set_data()), calling `fn` with the
// gradient about to be accumulated, and never from a capture (see the Note). Returns the hook's id
// for Tensor::remove_hook.
unsigned add_accumulation_hook(const at::Tensor& leaf, std::function<void(const at::Tensor&)> fn);

}  // namespace ddp::autograd
