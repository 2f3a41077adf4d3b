#pragma once
// Activation checkpointing: forward keeps none of a block's activations, backward recomputes
// them. Memory for compute: the block's forward runs twice, its activations live only during
// its own backward.
//
//   forward    fn(inputs) under NoGradGuard: no graph inside the block, no saved activations;
//              one node stands for the block and saves only its inputs, the RNG states and the
//              autocast state
//   backward   the node restores forward's RNG and autocast state, runs fn again with grad mode
//              on (on detached copies of the inputs), takes the gradients of the recomputed
//              outputs with respect to the inputs and the parameters, puts the RNG state back
//
// The module's parameters are inputs of that node, so their gradients leave it through the outer
// graph into their AccumulateGrad nodes: accumulator post-hooks (DDP's gradient-ready hooks, the
// sharded wrapper's) fire as without checkpointing, and a block whose inputs need no gradient
// (the first layer) still trains.
//
// [Note: recompute by nested grad] PyTorch's non-reentrant checkpoint recomputes through
// saved-tensor hooks; libtorch 1.13's C++ has none (they take PyObject*). Here the recompute is a
// nested torch::autograd::grad inside the node's backward. What users see is what the
// non-reentrant form promises (gradients flow through the outer graph, parameters get
// gradients when no input requires grad, hooks fire once per parameter per backward). What
// follows from the nested grad:
//   - no double backward: a backward with create_graph=true through a checkpoint is refused
//     (the gradients it returns carry no graph);
//   - fn is called twice, the second time inside the engine's backward, on the engine's thread
//     (the caller's for CPU; a device thread for CUDA), with grad mode on;
//   - fn (and what it captures) must stay valid until the backward, and must compute the same
//     outputs (count, shapes) from the same inputs, RNG state and parameters;
//   - the block's internal hooks (Tensor::register_hook inside fn) run during the recompute.
//
// [Note: the recompute's last projection] PyTorch's non-reentrant checkpoint stops its recompute
// once every tensor backward saved is recomputed (torch.utils.checkpoint's early stop), so a
// block's last projection, whose output is only added to the residual stream, is not recomputed:
// its backward needs its input and weight, not its output. The nested-grad recompute runs fn
// whole; output_linear (below) gives it the same saving: inside a recompute it makes the
// projection's node (at::linear's gradients) over an output of zeros, the bias added, without the
// GEMM (one a block: 14 ms of a 627 ms llama-3b step at 8192 tokens on an H200, by kernel trace).
// Since a gradient computed from those zeros would be silently wrong, the recompute walks its
// graph and refuses, by name, a path from fn's outputs to such a node through a node whose
// backward reads values (anything but additions, subtractions, views, casts and tensor
// parallelism's output all-reduce).

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <utility>
#include <vector>

namespace ddp::unit {

using CheckpointFn = std::function<at::Tensor(const at::Tensor&)>;
using CheckpointMultiFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// fn(input) without keeping its activations. `module` owns the parameters fn reads (pass the
// parent when fn reads several modules); their qualified names are unchanged. When grad mode is
// off, or neither the input nor a parameter requires grad, this is just fn(input).
at::Tensor activation_checkpoint(torch::nn::Module& module, const CheckpointFn& fn,
                                 const at::Tensor& input);

// Several inputs and outputs. Outputs of an integer or bool dtype carry no gradient; an input
// that does not require grad (indices, masks) gets none.
std::vector<at::Tensor> activation_checkpoint(torch::nn::Module& module,
                                              const CheckpointMultiFn& fn,
                                              const std::vector<at::Tensor>& inputs);

// at::linear(input, weight, bias) for a projection whose output reaches fn's outputs only through
// additions (a block's last projection): inside a checkpoint's recompute, its node without its
// value ([Note: the recompute's last projection]); elsewhere, and with autocast's casts,
// at::linear.
at::Tensor output_linear(const at::Tensor& input, const at::Tensor& weight,
                         const at::Tensor& bias = {});

// A module whose forward is the wrapped module's forward, checkpointed. The wrapped module is
// registered as the child "_checkpoint_wrapped_module" (PyTorch's checkpoint_wrapper name), so
// its parameter names gain that prefix: "fc1.weight" becomes
// "fc1._checkpoint_wrapped_module.weight" when fc1 is replaced by a wrapper. Code that must keep
// the names (the zoo, saved checkpoints) calls activation_checkpoint() in the parent's forward
// instead.
template <typename ModuleType>
class CheckpointWrapperImpl : public torch::nn::Module {
 public:
  explicit CheckpointWrapperImpl(ModuleType module)
      : module_(register_module("_checkpoint_wrapped_module", std::move(module))) {}

  at::Tensor forward(const at::Tensor& input) {
    return activation_checkpoint(
        *module_, [this](const at::Tensor& x) { return module_->forward(x); }, input);
  }

  ModuleType& module() { return module_; }

 private:
  ModuleType module_;
};

// Holder, as TORCH_MODULE gives: CheckpointWrapper<torch::nn::Linear> w(torch::nn::Linear(4, 4));
template <typename ModuleType>
using CheckpointWrapper = torch::nn::ModuleHolder<CheckpointWrapperImpl<ModuleType>>;

}  // namespace ddp::unit

namespace ddp {
// The short spelling: ddp::activation_checkpoint(module, fn, input).
using unit::activation_checkpoint;
using unit::CheckpointWrapper;
using unit::output_linear;
}  // namespace ddp
