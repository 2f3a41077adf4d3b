#pragma once
// The bytes a rank will hold under each style, before the first step (issue 60): pure, from the
// parameters' shapes and the options, so that a configuration that cannot fit the device is
// refused before it allocates, naming the numbers and the style that fits.
//
// Per rank, for a model of P parameter bytes (their own dtype) over `world` ranks:
//   parameters       replicate P; a sharded parameter its padded shard (ShardPlan's
//                    local_param_bytes), a replicated one whole
//   gradients        as the parameters (DDP's bucket storage, the sharded .grad)
//   optimizer state  optimizer_state_per_param_byte x the parameters' bytes (AdamW's two fp32
//                    moments: 2; SGD with momentum: 1; plain SGD: 0)
//   gathered         the sharded styles' transient units, at their largest: the root unit gathered
//                    for the whole step, plus (prefetch) two of the largest other unit in the
//                    gather dtype; at the end of backward the root's gradients (gather dtype) and
//                    its reduce-scatter input (reduce dtype) besides. 0 under replicate.
//   activations      the caller's estimate (MemoryInputs::activation_bytes), the same under every
//                    style; reported, never counted in a refusal (an estimate of the model's
//                    saved tensors, not of this library's)
// Measured against this on llama-8b at world 4 (AdamW, per block, bf16 gathers, fp32 reduce):
// parameters, gradients and optimizer state 32.19 GB of 32.19, the device peak 39.99 GB.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/shard/data_parallel_style.hpp"
#include "ddp/shard/shard_plan.hpp"

namespace ddp::parallel {

struct MemoryInputs {
  std::vector<shard::ParamShape> params;  // the distinct parameters (tied weights once)
  std::vector<std::string> units;         // the sharded styles' units (none: the root alone)
  int world = 1;
  // The gather and reduce dtypes (ShardOptions::param_dtype / reduce_dtype); none: the
  // parameters'.
  std::optional<c10::ScalarType> param_dtype;
  std::optional<c10::ScalarType> reduce_dtype;
  // Whether the next unit's gather overlaps this one's compute (ShardOptions::prefetch): two
  // units gathered at once instead of one.
  bool prefetch = true;
  // The optimizer's state per byte of parameter: 2 for Adam / AdamW (exp_avg, exp_avg_sq), 1 for
  // SGD with momentum, 0 for plain SGD. Default 2: the large-model regime's optimizer.
  double optimizer_state_per_param_byte = 2;
  // The forward's saved activations a rank (the model's estimate); 0: not estimated.
  int64_t activation_bytes = 0;
};

struct StyleEstimate {
  shard::DataParallelStyle style = shard::DataParallelStyle::kReplicate;
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer_state = 0;
  int64_t gathered = 0;
  int64_t activations = 0;
  // What a refusal counts: everything but the activations.
  int64_t held() const { return params + grads + optimizer_state + gathered; }
};

// replicate, fully_shard and default, in that order.
std::vector<StyleEstimate> estimate_memory(const MemoryInputs& inputs);

// "" when `chosen`'s held() fits `capacity` bytes; otherwise the refusal:
//   ddp: style replicate needs an estimated 128.48 GB a rank before activations (parameters
//   32.12 GB, gradients 32.12 GB, optimizer state 64.24 GB, gathered 0.00 GB; activations
//   ~9.50 GB) but the device holds 79.19 GB; style fully_shard fits: 40.32 GB a rank
// (or "; no style fits at world 4: use more ranks").
std::string memory_refusal(const std::vector<StyleEstimate>& estimates,
                           shard::DataParallelStyle chosen, int64_t capacity, int world);

// One estimate as a line for --verbose: "fully_shard: parameters 8.03 GB, gradients ...".
std::string format_estimate(const StyleEstimate& estimate);

}  // namespace ddp::parallel
