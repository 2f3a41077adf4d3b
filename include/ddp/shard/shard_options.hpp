#pragma once
// ShardOptions: FULLY_SHARD's and DEFAULT's options, in the one options model (as DDPOptions:
// each field once, with its default and reason; nested options held, not copied). describe()
// lists every field for --verbose, the tools and docs/options.md (a test keeps them in step).

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/gradients/gradient_options.hpp"
#include "ddp/shard/shard_plan.hpp"

namespace ddp::shard {

struct ShardOptions {
  // kFullyShard (default: the style users ask for when a model does not fit) or kDefault;
  // kReplicate is DistributedDataParallel's job and is refused here.
  DataParallelStyle style = DataParallelStyle::kFullyShard;
  // Qualified submodule names, one unit each (e.g. every "h.N" block); empty: one unit, the root.
  // Default empty: correct for any model, one collective per step each way.
  std::vector<std::string> units;
  // True (default, ZeRO-3; FSDP2's default for non-root units): a unit the model runs through
  // run_unit releases its gathered parameters after its forward and gathers them again for its
  // backward, so that one unit (plus a prefetched one) is gathered at a time instead of the whole
  // model, for one more all-gather per unit per step. False keeps them until its backward is done.
  // The root unit (and units the model does not run through run_unit) stays gathered either way.
  bool reshard_after_forward = true;
  // True (default): when a unit is gathered, the next unit's all-gather is issued too (in the last
  // forward's order, reversed in backward), so that it runs while this unit computes; costs one
  // more unit of gathered memory. False: each unit is gathered when it is needed.
  bool prefetch = true;
  // DEFAULT's replicated parameters (dim 0 does not divide) are averaged by DDP's reducer:
  // buckets, each all-reduced as soon as its gradients are ready, overlapping the rest of backward.
  // Its defaults (PyTorch's caps, gradients as bucket views) for the same reasons as DDP's.
  gradients::GradientOptions replicated;
  // FSDP2's mixed-precision policy, the gather side: the dtype of the gathered parameters, so the
  // forward and backward compute in it ([Note: gathering in param_dtype]). Default none: the
  // parameters' own dtype. kBFloat16 halves the all-gather bytes and the gathered memory and makes
  // the model compute in bf16 without autocast; the shards, their gradients and the optimizer
  // state stay in the parameters' dtype (master weights). As FSDP2 (cast_forward_inputs), the
  // floating-point inputs of the root's and of every unit's forward are cast to it. Style default
  // with replicated parameters is refused: they would keep their dtype beside cast ones.
  std::optional<c10::ScalarType> param_dtype;
  // The reduce side: the dtype in which gradients are reduce-scattered (the shards come back in
  // the parameters' dtype). Default none: param_dtype when set (FSDP2's default), else the
  // parameters' own dtype, exact fp32 averages. kHalf / kBFloat16 halve the bytes on the wire for
  // a rounding of the sum; a dtype the backend cannot reduce (Gloo: bf16) is refused at
  // construction, naming it.
  std::optional<c10::ScalarType> reduce_dtype;
  // Default true, as DDPOptions::broadcast_buffers (one buffer policy for every style; FSDP2 has
  // none): rank 0's buffers (BatchNorm's running statistics) are broadcast before every
  // synchronized forward, an evaluation's under no_grad included, so every rank normalises with
  // the same statistics and a checkpoint's (rank 0's) are every rank's. False: each rank keeps its
  // own (rank-local on purpose, or no buffer that changes: saves a collective per forward).
  bool broadcast_buffers = true;
  // Default 100, as DDPOptions::stats_every (PyTorch's logger): the units' reduce-scatters are
  // sampled in iterations 1-10, then every N-th, for logging_data().
  int64_t stats_every = 100;
  // Default false: when true, rank 0 prints the unit table (unit, parameter, shape, placement) at
  // construction, as DDPOptions::verbose prints the bucket table (DDP_LOG_LEVEL=info does the
  // same).
  bool verbose = false;
};

// Every option of `options` as (dotted name, value) in declaration order, `prefix` before each
// name: "style" -> "fully_shard", "units" -> "[h.0,h.1]", "param_dtype" -> "none",
// "replicated.buckets.bucket_cap_bytes" -> "26214400".
void describe(const ShardOptions& options, const std::string& prefix,
              std::vector<std::pair<std::string, std::string>>& out);

}  // namespace ddp::shard
