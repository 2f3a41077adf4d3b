#pragma once
// FlatParamGroup: the runtime of one unit's sharded parameters (FULLY_SHARD, and DEFAULT's
// evenly divisible ones). Between steps each rank keeps only its dim-0 shard of every parameter,
// packed into one flat tensor; unshard() all-gathers the unit in one collective and points the
// parameters at their full values; reduce_scatter_grads() averages the full gradients in one
// collective into gradient shards and reshards. The parameters keep their identity (the same
// TensorImpl the module and the optimizer hold): their storage is switched with set_(), so a
// torch::optim optimizer built after the group steps on the shards, and its state (momentum,
// exp_avg, ...) is shard-sized, without the user changing anything.
//
// [Note: flat shard layout] With S = the unit's local_numel (ShardPlan), rank r's flat shard
// holds, parameter after parameter, rows [r * chunk_p, (r + 1) * chunk_p) of parameter p
// (chunk_p * row_numel_p elements; rows past dim 0 are zero padding). The all-gather output is
// then (world, S) row-major, and parameter p's padded full tensor [world * chunk_p, ...] is
// the (world, chunk_p * row_numel_p) column block at offset off_p: one strided copy per parameter
// (FSDP2's copy-out). The reduce-scatter input is the same (world, S) layout filled from the full
// gradients, so rank r receives exactly its shard: the collectives take the even path.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/shard/shard_plan.hpp"

namespace ddp::shard {

enum class ShardedState {
  kSharded,    // parameters are views of the flat shard: [chunk_p, ...]; grads shard-sized or none
  kUnsharded,  // parameters are views of their full tensors [rows_p, ...], all-gathered
};

class FlatParamGroup {
 public:
  // `params`: every distinct parameter of the model, parallel to plan.shapes, holding the same
  // full values on every rank (after the initial broadcast). The group takes the sharded
  // parameters of plan.units[unit], copies this rank's rows into its flat shard and reshards
  // them. The group's rank and size must be plan.world's.
  FlatParamGroup(const ShardPlan& plan, size_t unit, const std::vector<at::Tensor>& params,
                 comm::ProcessGroupPtr pg);

  // kSharded -> kUnsharded: one all-gather of the flat shard, then each parameter's full tensor
  // is copied out of it and the parameter points at it. A sharded .grad (from earlier steps) is
  // set aside, so that backward accumulates a full-size gradient from nothing. A no-op when
  // already unsharded.
  void unshard();
  // kUnsharded -> kSharded without reducing (e.g. after an evaluation forward): parameters point
  // back at their shards, the full tensors and any full .grad are dropped, and the sharded .grad
  // set aside by unshard() is put back.
  void reshard();
  // In kUnsharded, after backward: averages every parameter's full .grad over the group (one
  // reduce-scatter of the (world, S) layout), reshards, and adds this rank's shard of the average
  // to the sharded .grad set aside by unshard(), as FSDP2 accumulates (or makes it the .grad when
  // there was none): [chunk_p, ...], padding rows 0. A parameter without a .grad counts as zeros.
  void reduce_scatter_grads();

  ShardedState state() const { return state_; }
  const std::string& unit_name() const { return unit_name_; }
  // The parameters this group manages, by index into the plan's parameters.
  const std::vector<size_t>& members() const { return members_; }
  const at::Tensor& flat_shard() const { return shard_; }

 private:
  struct Member {
    at::Tensor param;                  // the module's parameter (identity preserved)
    std::vector<int64_t> full_sizes;   // [rows, rest...]
    std::vector<int64_t> shard_sizes;  // [chunk, rest...]
    int64_t rows = 0, chunk = 0, row_numel = 0;
    int64_t offset = 0;     // in the flat shard
    at::Tensor full;        // padded [world * chunk, rest...] while unsharded
    at::Tensor shard_grad;  // the sharded .grad set aside while unsharded
  };
  std::string describe_state() const;
  void require_state(ShardedState wanted, const char* operation) const;
  void point_at_shards();

  comm::ProcessGroupPtr pg_;
  std::string unit_name_;
  std::vector<size_t> members_;
  std::vector<Member> params_;
  int world_ = 1;
  int64_t shard_numel_ = 0;  // S
  at::Tensor shard_;         // this rank's flat shard: S elements
  ShardedState state_ = ShardedState::kSharded;
};

}  // namespace ddp::shard
