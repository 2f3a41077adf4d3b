#pragma once
// ModuleIntake: what a data-parallel runtime takes from a module, taken one way for every style
// (DistributedDataParallel, the sharded styles, tensor parallelism, the tools).
//
//   take_in               the distinct parameters in registration order (a tied weight once,
//                         under its first name, its other names kept as aliases), frozen ones
//                         included (requires_grad false: they are part of the replica and of
//                         rank 0's broadcast, but get no gradient, no hook, no optimizer state in
//                         any style), the buffers, and the caller's ignore list left out
//   synchronize_replicas  collective: every rank holds the same model (names, shapes, dtypes of
//                         the parameters and buffers; replica_check.hpp), rank 0's parameters and
//                         buffers are broadcast, and a checksum of every tensor's values then
//                         confirms that every rank starts from the same values
//
// libtorch's named_parameters() lists a tied tensor under each name, and parameters() does too:
// every runtime that took them in by hand had to deduplicate, and most forgot frozen parameters
// or buffers.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch::nn {
class Module;
}
namespace ddp::comm {
class ProcessGroup;
}

namespace ddp::intake {

struct ModuleIntake {
  // Distinct parameters by TensorImpl, in registration order; names[i] is the first name of
  // params[i] and aliases[i] its other names (tied weights: GPT's lm_head.weight for wte.weight).
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> aliases;
  // Distinct buffers (running statistics, ...) not already listed as parameters.
  std::vector<at::Tensor> buffers;
  std::vector<std::string> buffer_names;

  // Indices into params of those that require grad: what gets gradients, hooks, reductions.
  std::vector<size_t> trainable() const;
  std::vector<at::Tensor> trainable_params() const;
  std::vector<std::string> trainable_names() const;
};

// Reads `module` (no communication). `ignore`: qualified names of parameters or buffers left out
// entirely (DistributedDataParallel's params_to_ignore); a name that is neither is an error that
// names it.
ModuleIntake take_in(const torch::nn::Module& module, const std::vector<std::string>& ignore = {});

// Values no rank holds whole, by parameter: deferred initialisation (shard/deferred_init.hpp) kept
// only each rank's rows of them and their checksum (float64 [sum, sum of squares] of the whole
// value, NaNs as 0), which synchronize_replicas compares instead of broadcasting them.
using AbsentValues = std::unordered_map<const c10::TensorImpl*, at::Tensor>;

// Collective over `group`: the replica check, rank 0's parameters and buffers broadcast, then the
// values checksummed (one all-reduce): a tensor whose values still differ afterwards is an error
// naming it and how many ranks disagree with rank 0, on every rank. `who` names the caller (the
// wrapper being built) in the broadcast's and the checksum's errors.
// A parameter in `absent` is not broadcast, its checksum is compared; a placeholder not in it is
// an error naming it (built for another style).
void synchronize_replicas(comm::ProcessGroup& group, const ModuleIntake& intake,
                          const std::string& who, const AbsentValues& absent = {});

}  // namespace ddp::intake
