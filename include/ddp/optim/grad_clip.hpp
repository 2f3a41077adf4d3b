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
#include "ddp/comm/sharding/sharding.hpp"
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
// The same as `sharding` splits them over its groups (comm/sharding/sharding.hpp): what every
// wrapper and tensor parallelism answer, so the caller never picks groups by style.
GradShards grad_shards(torch::nn::Module& module, const comm::Sharding& sharding);

// The total norm of the whole gradients (a 0-d float tensor on the gradients' device; 0 with no
// gradients), norm_type 2 or infinity. Collective: one per mesh dim in some set ([Note: a norm
// over layouts]).
at::Tensor total_grad_norm(const GradShards& grads, double norm_type = 2.0);

// What one clip leaves on the device: nothing here is read by the host unless asked.
struct ClipResult {
  at::Tensor total_norm;  // 0-d float32 on the gradients' device: the norm before clipping
  at::Tensor nonfinite;   // 0-d float32 there: 1 when total_norm is nan or inf, else 0
  // The host reads (each a device sync): for logs and tests, not for every step.
  double norm() const;
  bool skipped() const;
};

// Computes the total norm and scales every gradient by min(1, max_norm / (total + 1e-6)) in
// place, all on the device; a non-finite total leaves the gradients unscaled (the optimizer's
// skip flag then drops the step: DeviceStep::skip_when). Under NonFinite::kError this function
// reads the flag on the host and throws "ddp: clip_grad_norm: the total gradient norm is <nan|inf>
// at step <step> ..." (PyTorch's error_if_nonfinite, which reads it too); under kSkip it reads
// nothing. `step` only names the step in errors.
ClipResult clip_grad_norm(const GradShards& grads, const ClipOptions& options, int64_t step = -1);

// What a training loop holds across steps: clip_grad_norm without any host read per step, its
// results kept in device tensors that stay put (a captured step writes them on every replay).
//
//   GradClipper clipper(options, device, first_step);
//   opt.skip_when(clipper.skip_flag());     // the optimizer drops a non-finite step on the device
//   ... backward; clipper.clip(grads); opt.step(); ...
//   at a log line: clipper.last_norm(), clipper.check()   (host reads)
//
// Under either policy a non-finite step changes no parameter (the optimizer skips it); check()
// then throws under kError, naming the first such step and its norm, and under kSkip logs the
// count once per new skip.
class GradClipper {
 public:
  // `device`: the gradients'; `first_step`: the number of the first step clip() sees (names steps
  // in check()'s messages).
  GradClipper(ClipOptions options, c10::Device device = c10::kCPU, int64_t first_step = 1);
  // Clips this step's gradients (collective as clip_grad_norm), no host read.
  void clip(const GradShards& grads);
  // 0-d float32 on the device: 1 while the last clipped step's norm is not finite. Stays put.
  const at::Tensor& skip_flag() const { return flag_; }
  // 0-d float32 on the device: the last clipped step's total norm. Stays put (clone it to keep a
  // step's value without a host read).
  const at::Tensor& norm() const { return norm_; }
  // Host reads (device syncs).
  double last_norm() const;
  int64_t skipped_steps() const;
  // kError: throws if a step's norm was not finite, naming the first one; kSkip: logs a warning
  // when steps were skipped since the last check. A host read.
  void check();
  const ClipOptions& options() const { return options_; }

 private:
  ClipOptions options_;
  // Device scalars, made once: the last norm, the last step's flag, the count of skipped steps,
  // the number of the step clip() is at, and the first non-finite step (-1: none) and its norm.
  at::Tensor norm_, flag_, skipped_, step_, first_bad_step_, first_bad_norm_;
  int64_t reported_ = 0;  // skipped steps check() has logged
};

}  // namespace ddp::optim
