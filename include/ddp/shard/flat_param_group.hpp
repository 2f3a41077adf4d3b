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

#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/gradients/unit_storage.hpp"
#include "ddp/shard/gather_pool.hpp"
#include "ddp/shard/shard_plan.hpp"

namespace ddp::shard {

enum class ShardedState {
  kSharded,    // parameters are views of the flat shard: [chunk_p, ...]; grads shard-sized or none
  kUnsharded,  // parameters are views of the full buffer [rows_p, ...], which holds the gathered
               // values
  kReleased,   // parameters keep their full shapes and views, but the full buffer has no memory
               // (after a forward with reshard_after_forward, or once the unit's gradients are
               // reduced); unshard() gathers into the same storage again
};
const char* state_name(ShardedState state);

// [Note: releasing without set_] Autograd saves the parameters (or views of them) for backward and
// checks their version counters when it uses them; set_() bumps the counter, so a parameter that
// was pointed elsewhere between its forward and its backward would fail there ("modified by an
// inplace operation"). Releasing therefore keeps every parameter's view of the full buffer and
// takes the memory out from under the buffer's StorageImpl (its DataPtr replaced by an empty one,
// nbytes 0); gathering again allocates a fresh DataPtr of the same size into the same StorageImpl.
// Nothing autograd can see changes: FSDP2 does the same with storage resize_(0). The parameters
// move to their shards with set_() only between steps (end of backward), when no graph holds them.
//
// [Note: gathering in param_dtype] With a param_dtype other than the shards' (FSDP2's
// mixed-precision policy), the shards stay in their dtype (the optimizer's master weights) and
// unshard() gathers a cast copy: each rank casts its shard and the all-gather moves the cast
// bytes (viewed as uint8: the bits are what is gathered, and Gloo 1.13 moves no bf16), half the
// traffic and half the gathered memory for bf16. set_() cannot change a tensor's dtype, so the
// parameters move between their shards and the full buffer with set_data() (Python's
// `param.data = ...`): dtype, storage and shape of the same TensorImpl, version counter untouched.
// It drops the gradient accumulator, as set_() effectively does (the hooks are installed again
// with every new full buffer). Backward then produces param_dtype gradients, reduce-scattered in
// the reduce dtype, and the shards' .grad is in the shards' dtype again.

// One member's part of [Note: flat shard layout]: `rows` of dim 0, `chunk` rows per rank,
// `row_numel` elements per row; it fills chunk * row_numel columns of each rank's row.
struct ReduceInputBlock {
  int64_t rows = 0;
  int64_t chunk = 0;
  int64_t row_numel = 0;
};

// The reduce-scatter copy-in of [Note: flat shard layout]: each full gradient (shaped [rows, ...],
// or undefined: zeros) chunked by rank into row k of `out`, a (world, S) view with S the sum of
// the blocks, padding rows zero. With `fused` and every gradient defined in out's dtype and
// device, one at::_chunk_cat kernel (FSDP2's copy-in; torch >= 2.4, whose chunks are torch.chunk's
// even split, FlatShards' rule); otherwise one copy per gradient. Both write the same bytes
// (tests/shard check it at worlds 1-4 with uneven rows).
void copy_into_reduce_input(at::Tensor out, const std::vector<at::Tensor>& grads,
                            const std::vector<ReduceInputBlock>& blocks, int world,
                            bool fused = true);

class FlatParamGroup : public gradients::UnitStorage {
 public:
  // `params`: every distinct parameter of the model, parallel to plan.shapes, holding the same
  // full values on every rank (after the initial broadcast). The group takes the sharded
  // parameters of plan.units[unit], copies this rank's rows into its flat shard and reshards
  // them. The group's rank and size must be plan.world's.
  FlatParamGroup(const ShardPlan& plan, size_t unit, const std::vector<at::Tensor>& params,
                 comm::ProcessGroupPtr pg);

  // Gathers into `pool`'s buffer (shared by the model's units) instead of a new output per
  // gather; the pool outlives the group. Null (the default): a new output each time.
  void use_gather_pool(GatherPool* pool) { pool_ = pool; }
  // Issues the unit's all-gather without waiting (prefetch). A no-op when unsharded or when one
  // is already in flight.
  void start_unshard();
  // -> kUnsharded: completes the all-gather (issuing it when start_unshard was not called), then
  // copies each parameter's full tensor out of it into the full buffer. From kSharded the
  // parameters are pointed at the buffer and a sharded .grad (from earlier steps) is set aside,
  // so that backward accumulates a full-size gradient from nothing; returns true then (their
  // gradient accumulators are new: hooks must be installed again). A no-op when unsharded.
  bool unshard();
  // kUnsharded -> kReleased: the full buffer's memory is freed, the parameters keep their views
  // (FSDP2's post-forward reshard; see [Note: releasing without set_]). A no-op unless unsharded.
  void free_full();
  // Any state -> kSharded without reducing (e.g. after an evaluation forward): parameters point
  // back at their shards, the full buffer and any full .grad are dropped, and the sharded .grad
  // set aside by unshard() is put back.
  void reshard();
  // Whether unshard() set a sharded .grad aside that holds anything but zeros (a host read): the
  // gradients of an earlier backward that an optimizer step cannot see while they are aside.
  bool holds_gradients_aside() const;

  // After the unit's backward: writes every member's full gradient into `input`, the (world, S)
  // layout of [Note: flat shard layout] (padding rows zeros, a member without a gradient zeros),
  // drops the full gradients and the full buffer's memory. `member` (or -1): the member whose
  // gradient of this backward is `incoming`, not yet accumulated into its .grad (a tensor hook's
  // view: gradients/unit_buckets.hpp); its .grad, if any, is added. From kSharded (not
  // gathered in this step) the sharded .grad is set aside first, as unshard() does. The reduction
  // itself is the caller's (the gradient runtime's UnitBuckets).
  void fill_reduce_input(const at::Tensor& input, int64_t member,
                         const at::Tensor& incoming) override;
  // After fill_reduce_input: reshards and adds `shard` (this rank's S elements of the average) to
  // the sharded .grad set aside by unshard(), as FSDP2 accumulates (or makes it the .grad when
  // there was none): [chunk_p, ...], padding rows 0.
  void finish_reduce_scatter(const at::Tensor& shard) override;
  // Both around a blocking averaged reduce-scatter on the group: for callers that reduce a unit
  // by hand (tests, tools); the training runtime goes through the GradientRuntime.
  void reduce_scatter_grads();
  // S, and member i's first column in a row of the layout.
  int64_t shard_numel() const { return shard_numel_; }
  std::vector<int64_t> member_offsets() const;
  c10::ScalarType reduce_dtype() const { return reduce_dtype_.value_or(shard_.scalar_type()); }
  // The dtype of the reduce-scatter (default: the parameters'); set before the first backward.
  void set_reduce_dtype(c10::ScalarType dtype) { reduce_dtype_ = dtype; }
  // The dtype of the gathered parameters (default: the shards'; [Note: gathering in
  // param_dtype]); set while sharded, before the first unshard.
  void set_param_dtype(c10::ScalarType dtype);
  c10::ScalarType param_dtype() const { return gather_dtype_; }

  ShardedState state() const { return state_; }
  const std::string& unit_name() const { return unit_name_; }
  // Its unit index in the plan (ShardPlan::units): the number the recorder names it by.
  size_t unit() const { return unit_; }
  // The parameters this group manages, by index into the plan's parameters.
  const std::vector<size_t>& members() const { return members_; }
  const std::vector<at::Tensor>& params() const { return handles_; }
  const at::Tensor& flat_shard() const { return shard_; }
  // Bytes of the gathered parameters (world * S elements of param_dtype): what unshard() holds.
  int64_t full_bytes() const;
  // Bytes this group holds beyond its shard now: the full buffer when it has memory, and an
  // all-gather output in flight unless it is the pool's (the pool counts its own; the reduce
  // input is the GradientRuntime's).
  int64_t transient_bytes() const { return full_buffer_bytes() + own_gather_bytes(); }
  // Its parts: the full buffer when it has memory; an all-gather output in flight or not yet
  // dropped that is not the pool's.
  int64_t full_buffer_bytes() const { return full_has_memory_ ? full_bytes() : 0; }
  int64_t own_gather_bytes() const;

 private:
  struct Member {
    at::Tensor param;                  // the module's parameter (identity preserved)
    std::vector<int64_t> full_sizes;   // [rows, rest...]
    std::vector<int64_t> shard_sizes;  // [chunk, rest...]
    int64_t rows = 0, chunk = 0, row_numel = 0;
    int64_t offset = 0;     // in the flat shard; world * offset in the full buffer
    at::Tensor shard_grad;  // the sharded .grad set aside while unsharded
  };
  void require_state(bool ok, const char* operation) const;
  void point_at_shards();
  // Completes the all-gather in flight and drops its handle; the gathered full buffer, valid
  // until the caller gives its pool slot back (done_with_gathered).
  at::Tensor wait_gather();
  void done_with_gathered();
  // The output of the next all-gather: `numel` of `dtype` from the pool, or new.
  at::Tensor gather_output(int64_t numel, c10::ScalarType dtype);
  void copy_out(const at::Tensor& gathered);

  comm::ProcessGroupPtr pg_;
  std::string unit_name_;
  size_t unit_;  // its unit in the plan: what the flight recorder says its collectives are for
  std::vector<size_t> members_;
  std::vector<Member> params_;
  std::vector<at::Tensor> handles_;
  int world_ = 1;
  int64_t shard_numel_ = 0;  // S
  at::Tensor shard_;         // this rank's flat shard: S elements
  // The full buffer (world * S elements; member p's padded [world * chunk_p, ...] at
  // world * offset_p); defined from the first unshard of a step to the end of its backward.
  at::Tensor full_;
  bool full_has_memory_ = false;
  comm::PendingCollective gather_;  // the all-gather in flight, when gathering_
  GatherPool* pool_ = nullptr;      // see use_gather_pool
  GatherPool::Ticket ticket_;       // the pool buffer of the gather in flight or being copied out
  bool gathering_ = false;
  bool reducing_ = false;  // the reduce input was filled, the result not yet taken
  std::optional<c10::ScalarType> reduce_dtype_;
  c10::ScalarType gather_dtype_;  // the full buffer's dtype: param_dtype, else the shard's
  ShardedState state_ = ShardedState::kSharded;
};

}  // namespace ddp::shard
