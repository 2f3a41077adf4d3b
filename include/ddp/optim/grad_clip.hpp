#pragma once
// Gradient-norm clipping over layouts: torch.nn.utils.clip_grad_norm_ for a model whose gradients
// are split across ranks (FULLY_SHARD, DEFAULT, tensor parallelism, and both on a 2-D mesh). The
// total norm is the norm of the WHOLE gradients, as one process training on the global batch
// would compute it, so clipping changes nothing about the equivalence invariant.
//
// [Note: a norm over layouts] A rank holds the real part of each gradient its layout gives it
// (comm::real_local: padding rows are never counted). Split over mesh dims S, a gradient's
// contribution must be summed over the ranks of S and only those: along a mesh dim that does not
// split it every rank holds the same values (DDP's all-reduce, a TP-replicated bias), so summing
// there would count it once per replica. The partial sums are therefore kept per set S (at most
// 2^dims of them, known from the layouts alone, hence the same on every rank), and each mesh dim d
// issues ONE collective over the partials whose S contains d, in ascending d:
//
//   mesh {dp 2, tp 2}, FULLY_SHARD over TP       partials          dp all-reduce   tp all-reduce
//     c_attn.weight  Shard(0) tp, Shard(0) dp    S = {dp, tp}      summed          summed
//     ln.weight      Shard(0) dp                 S = {dp}          summed          -
//     (whole)        nothing                     S = {}            -               -
//   total^2 = sum of the partials (inf-norm: their max, with max in place of the sums)
//
// DDP (every S empty) communicates nothing. Gradients are scaled in place by
// min(1, max_norm / (total + 1e-6)), as PyTorch.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/layout/tensor_layouts.hpp"

namespace torch::nn {
class Module;
}

namespace ddp::optim {

// What a non-finite (nan or inf) total norm does.
enum class NonFinite {
  kError,  // throw, naming the step and the norm (PyTorch's error_if_nonfinite=True)
  kSkip,   // leave the gradients unscaled; the caller skips the optimizer step (counted, logged)
};
const char* non_finite_name(NonFinite policy);  // "error", "skip"
NonFinite non_finite_from_name(const std::string& name);

struct ClipOptions {
  // The largest total norm left unchanged; larger ones are scaled down to it. Default 1.0, the
  // clip of nanoGPT and most GPT recipes. Must be > 0 (else clip_error).
  double max_norm = 1.0;
  // 2 (the Euclidean norm, PyTorch's default) or infinity (the largest |element|); other p are
  // refused (clip_error): no recipe uses them, and an untested norm is a silent risk.
  double norm_type = 2.0;
  // Default kError: a nan gradient would otherwise poison every parameter silently.
  NonFinite non_finite = NonFinite::kError;
};

// Why `options` cannot clip ("" when it can), naming --grad-clip for max_norm as the tools spell
// it.
std::string clip_error(const ClipOptions& options);

// One rank's gradients with how they are split: what the total norm is computed from.
struct GradShards {
  struct Entry {
    std::string name;               // the parameter's first name
    at::Tensor grad;                // the real part this rank holds (a view into .grad)
    std::vector<int> sharded_over;  // the mesh dims splitting it, ascending
  };
  std::vector<Entry> entries;  // parameters with a gradient, each once (tied: the first name)
  // Every set of mesh dims some parameter is split over (with or without a gradient here): the
  // same on every rank, so every rank issues the same collectives.
  std::vector<std::vector<int>> sets;
  // This rank's group along each mesh dim (layouts.mesh order); may be null for a dim that splits
  // nothing. A dim whose group has one rank communicates nothing.
  std::vector<comm::ProcessGroupPtr> groups;
};

// `module`'s parameters (distinct tensors; frozen ones and those without a gradient are skipped),
// split as `layouts` says over `groups` (one per layouts->mesh dim, this rank's group along it).
// Null layouts: every gradient is whole (DDP, one process). Between backward and the optimizer
// step: a split parameter must be its stored shard (comm::real_local's check names it otherwise).
GradShards grad_shards(torch::nn::Module& module, const layout::TensorLayouts* layouts = nullptr,
                       std::vector<comm::ProcessGroupPtr> groups = {});

// The total norm of the whole gradients (a 0-d float tensor on the gradients' device; 0 with no
// gradients), norm_type 2 or infinity. Collective: one per mesh dim in some set ([Note: a norm
// over layouts]).
at::Tensor total_grad_norm(const GradShards& grads, double norm_type = 2.0);

struct ClipResult {
  double total_norm = 0;  // before clipping
  bool skipped = false;   // non-finite under NonFinite::kSkip: do not step
};

// Computes the total norm and scales every gradient by min(1, max_norm / (total + 1e-6)) in
// place. A non-finite total: NonFinite::kError throws "ddp: clip_grad_norm: the total gradient
// norm is <nan|inf> at step <step> ...", kSkip returns skipped (gradients unchanged). `step`
// only names the step in errors and logs.
ClipResult clip_grad_norm(const GradShards& grads, const ClipOptions& options, int64_t step = -1);

// clip_grad_norm with a count of the steps it skipped, each logged as a warning: what a training
// loop holds across steps.
class GradClipper {
 public:
  explicit GradClipper(ClipOptions options);
  ClipResult clip(const GradShards& grads, int64_t step);
  int64_t skipped_steps() const { return skipped_; }
  const ClipOptions& options() const { return options_; }

 private:
  ClipOptions options_;
  int64_t skipped_ = 0;  // steps clip() returned skipped for, since construction
};

}  // namespace ddp::optim
