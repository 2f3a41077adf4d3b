#include "ddp/shard/flat_param_group.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "ddp/comm/flat_shards.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/detail/torch_compat.hpp"
#include "ddp/shard/deferred_init.hpp"

namespace ddp::shard {
namespace {

std::vector<int64_t> with_dim0(const std::vector<int64_t>& sizes, int64_t dim0) {
  std::vector<int64_t> out = sizes.empty() ? std::vector<int64_t>{1} : sizes;
  out[0] = dim0;
  return out;
}

// Points `param` at `sizes` (contiguous) elements of `source` from `offset`, keeping its identity
// (and taking `source`'s dtype: [Note: gathering in param_dtype]).
void point(at::Tensor& param, const at::Tensor& source, int64_t offset,
           const std::vector<int64_t>& sizes) {
  at::NoGradGuard no_grad;  // set_ on a leaf that requires grad is not an autograd operation
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  if (param.scalar_type() == source.scalar_type()) {
    param.set_(source.storage(), source.storage_offset() + offset, sizes, strides);
  } else {
    param.set_data(source.as_strided(sizes, strides, source.storage_offset() + offset));
  }
}

}  // namespace

void copy_into_reduce_input(at::Tensor out, const std::vector<at::Tensor>& grads,
                            const std::vector<ReduceInputBlock>& blocks, int world, bool fused) {
  TORCH_CHECK(grads.size() == blocks.size(), "ddp: copy_into_reduce_input: ", grads.size(),
              " gradients for ", blocks.size(), " blocks");
  at::NoGradGuard no_grad;
#if DDP_HAVE_CHUNK_CAT
  const bool one_kernel =
      fused && !grads.empty() && std::all_of(grads.begin(), grads.end(), [&](const at::Tensor& g) {
        return g.defined() && g.scalar_type() == out.scalar_type() && g.device() == out.device();
      });
  if (one_kernel) {
    at::_chunk_cat_out(out, grads, /*dim=*/0, /*num_chunks=*/world);
    return;
  }
#else
  (void)fused;
#endif
  int64_t offset = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    const ReduceInputBlock& m = blocks[i];
    const at::Tensor block = out.narrow(1, offset, m.chunk * m.row_numel);  // (world, ...)
    offset += m.chunk * m.row_numel;
    const at::Tensor& grad = grads[i];
    if (!grad.defined()) {
      block.zero_();
      continue;
    }
    const at::Tensor rows = grad.reshape({m.rows, m.row_numel});
    if (m.rows == world * m.chunk) {
      block.copy_(rows.view({world, -1}));  // dim 0 divides: one strided copy, no padding
      continue;
    }
    // Rank k's rows into row k of the layout, then its padding rows (zeros).
    const comm::FlatShards split{m.rows, world};
    for (int k = 0; k < world; ++k) {
      const int64_t n = split.length(k);
      const at::Tensor mine = block[k];
      if (n > 0) {
        mine.narrow(0, 0, n * m.row_numel).copy_(rows.narrow(0, split.offset(k), n).reshape({-1}));
      }
      if (n < m.chunk) mine.narrow(0, n * m.row_numel, (m.chunk - n) * m.row_numel).zero_();
    }
  }
}

FlatParamGroup::FlatParamGroup(const ShardPlan& plan, size_t unit,
                               const std::vector<at::Tensor>& params, comm::ProcessGroupPtr pg)
    : pg_(std::move(pg)), unit_(unit), world_(plan.world), gather_dtype_(at::kFloat) {
  TORCH_CHECK(pg_, "ddp: FlatParamGroup needs a process group");
  TORCH_CHECK(unit < plan.units.size(), "ddp: FlatParamGroup: unit ", unit, " of ",
              plan.units.size());
  TORCH_CHECK(params.size() == plan.shapes.size(), "ddp: FlatParamGroup: ", params.size(),
              " parameters for a plan of ", plan.shapes.size());
  TORCH_CHECK(pg_->world_size() == plan.world, "ddp: the shard plan is for ", plan.world,
              " ranks but the process group has ", pg_->world_size());
  const Unit& spec = plan.units[unit];
  unit_name_ = spec.name.empty() ? "<root>" : spec.name;
  const int rank = pg_->rank();
  for (size_t i : spec.params) {
    const ParamShard& s = plan.params[i];
    if (!s.sharded()) continue;
    const at::Tensor& p = params[i];
    TORCH_CHECK(p.sizes().vec() == plan.shapes[i].shape, "ddp: unit '", unit_name_,
                "': parameter '", plan.shapes[i].name, "' has shape ", p.sizes(),
                " but the plan was made for ", at::IntArrayRef(plan.shapes[i].shape));
    if (!params_.empty()) {
      TORCH_CHECK(p.scalar_type() == params_[0].param.scalar_type() &&
                      p.device() == params_[0].param.device(),
                  "ddp: unit '", unit_name_, "' mixes ", params_[0].param.scalar_type(), " on ",
                  params_[0].param.device(), " with ", p.scalar_type(), " on ", p.device(),
                  " (parameter '", plan.shapes[i].name,
                  "'): a unit is one flat tensor; put them in different units");
    }
    Member m;
    m.param = p;
    m.rows = s.rows();
    m.chunk = s.chunk();
    m.row_numel = s.row_numel();
    m.full_sizes = with_dim0(plan.shapes[i].shape, m.rows);
    m.shard_sizes = with_dim0(plan.shapes[i].shape, m.chunk);
    m.offset = shard_numel_;
    shard_numel_ += s.local_numel();
    members_.push_back(i);
    handles_.push_back(p);
    params_.push_back(std::move(m));
  }
  const auto options = params_.empty() ? at::TensorOptions(at::kFloat) : params_[0].param.options();
  shard_ = at::zeros({shard_numel_}, options.requires_grad(false));
  gather_dtype_ = shard_.scalar_type();
  at::NoGradGuard no_grad;
  for (Member& m : params_) {
    const int64_t rows_here = comm::FlatShards{m.rows, world_}.length(rank);
    // Deferred initialisation kept only these rows (deferred_init.hpp): the parameter is a
    // placeholder until point_at_shards below.
    if (const std::optional<KeptRows> kept = take_kept_rows(m.param)) {
      if (rows_here > 0) {
        shard_.narrow(0, m.offset, rows_here * m.row_numel).copy_(kept->rows.reshape({-1}));
      }
      continue;
    }
    if (rows_here == 0) continue;
    const int64_t first = comm::FlatShards{m.rows, world_}.offset(rank);
    shard_.narrow(0, m.offset, rows_here * m.row_numel)
        .copy_(m.param.detach()
                   .reshape({m.rows, m.row_numel})
                   .narrow(0, first, rows_here)
                   .reshape({-1}));
  }
  point_at_shards();
}

const char* state_name(ShardedState state) {
  switch (state) {
    case ShardedState::kSharded:
      return "sharded";
    case ShardedState::kUnsharded:
      return "unsharded";
    case ShardedState::kReleased:
      return "released";
  }
  return "?";
}

void FlatParamGroup::require_state(bool ok, const char* operation) const {
  TORCH_CHECK(ok, "ddp: unit '", unit_name_, "': ", operation, " in the ", state_name(state_),
              " state", reducing_ ? " with a reduce-scatter in flight" : "");
}

void FlatParamGroup::set_param_dtype(c10::ScalarType dtype) {
  require_state(state_ == ShardedState::kSharded && !gathering_, "set_param_dtype");
  TORCH_CHECK(at::isFloatingType(dtype), "ddp: param_dtype ", dtype,
              " is not a floating-point type (unit '", unit_name_, "')");
  gather_dtype_ = dtype;
}

int64_t FlatParamGroup::full_bytes() const {
  return world_ * shard_numel_ * static_cast<int64_t>(c10::elementSize(gather_dtype_));
}

int64_t FlatParamGroup::own_gather_bytes() const {
  // A gathered output counts as long as its handle keeps it alive (in flight, or not dropped),
  // unless the pool holds it (counted once, by the schedule).
  return gather_.result().defined() && !ticket_.pooled ? full_bytes() : 0;
}

void FlatParamGroup::point_at_shards() {
  for (Member& m : params_) point(m.param, shard_, m.offset, m.shard_sizes);
  full_ = at::Tensor();
  full_has_memory_ = false;
  state_ = ShardedState::kSharded;
}

void FlatParamGroup::start_unshard() {
  if (state_ == ShardedState::kUnsharded || gathering_) return;
  require_state(!reducing_, "start_unshard");
  const comm::ForPurpose purpose({comm::Purpose::kUnitGather, static_cast<int64_t>(unit_)});
  const bool cast = gather_dtype_ != shard_.scalar_type();  // [Note: gathering in param_dtype]
  at::Tensor output = cast ? gather_output(full_bytes(), at::kByte)
                           : gather_output(shard_numel_ * world_, gather_dtype_);
  if (ticket_.pooled && pool_->registered()) {
    // In place: this rank's shard copied (cast) into its slot of the registered buffer, so that
    // both of the all-gather's buffers lie in the communicator's window (NcclOptions::
    // register_buffers); the copy replaces the cast copy of the path below.
    at::Tensor slot =
        output.view(gather_dtype_).narrow(0, pg_->rank() * shard_numel_, shard_numel_);
    slot.copy_(shard_);
    gather_ = pg_->all_gather_async(cast ? slot.view(at::kByte) : slot, output);
  } else if (cast) {
    gather_ = pg_->all_gather_async(shard_.to(gather_dtype_).view(at::kByte), output);
  } else {
    gather_ = pg_->all_gather_async(shard_, output);
  }
  gathering_ = true;
}

at::Tensor FlatParamGroup::gather_output(int64_t numel, c10::ScalarType dtype) {
  if (pool_ == nullptr) return at::empty({numel}, shard_.options().dtype(dtype));
  return pool_->take(numel, shard_.options().dtype(dtype), *pg_, &ticket_);
}

void FlatParamGroup::done_with_gathered() {
  if (pool_ != nullptr) pool_->give_back(&ticket_);
}

at::Tensor FlatParamGroup::wait_gather() {
  at::Tensor gathered = gather_.wait_on_stream("all-gather of unit '" + unit_name_ + "'");
  // The pending collective keeps its result: drop it, or every unit would keep its last gathered
  // copy (a whole model's worth, measured: 1.6 GB on gpt2-medium) alive between steps.
  gather_ = comm::PendingCollective();
  gathering_ = false;
  // [Note: gathering in param_dtype]: the bytes of a cast copy.
  return gathered.scalar_type() == gather_dtype_ ? gathered : gathered.view(gather_dtype_);
}

void FlatParamGroup::copy_out(const at::Tensor& gathered) {
  // [Note: flat shard layout]: parameter p is the (world, block_p) column block at offset_p. One
  // split-and-copy for the whole unit (FSDP2's copy-out: one kernel on CUDA since torch 2.3, a
  // copy per parameter in 1.13), instead of one launch per parameter.
  const at::Tensor by_rank = gathered.view({world_, shard_numel_});
  at::NoGradGuard no_grad;
  std::vector<int64_t> blocks;
  std::vector<at::Tensor> outs;
  blocks.reserve(params_.size());
  outs.reserve(params_.size());
  for (Member& m : params_) {
    const int64_t block = m.chunk * m.row_numel;
    blocks.push_back(block);
    outs.push_back(full_.narrow(0, world_ * m.offset, world_ * block).view({world_, block}));
  }
  if (!outs.empty()) at::split_with_sizes_copy_out(outs, by_rank, blocks, /*dim=*/1);
}

bool FlatParamGroup::unshard() {
  if (state_ == ShardedState::kUnsharded) return false;
  require_state(!reducing_, "unshard");
  start_unshard();
  const at::Tensor gathered = wait_gather();
  const size_t nbytes = static_cast<size_t>(full_bytes());
  const bool from_shards = state_ == ShardedState::kSharded;
  if (from_shards) {
    full_ = at::empty({world_ * shard_numel_}, shard_.options().dtype(gather_dtype_));
  } else {
    // [Note: releasing without set_]: new memory under the same StorageImpl.
    c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
    storage->set_nbytes(nbytes);
  }
  full_has_memory_ = true;
  copy_out(gathered);
  done_with_gathered();  // queued before any later gather into the same buffer
  if (from_shards) {
    for (Member& m : params_) {
      point(m.param, full_, world_ * m.offset, m.full_sizes);
      m.shard_grad = m.param.grad();
      m.param.mutable_grad() = at::Tensor();
    }
  }
  state_ = ShardedState::kUnsharded;
  return from_shards;
}

void FlatParamGroup::free_full() {
  if (state_ != ShardedState::kUnsharded) return;
  c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  full_has_memory_ = false;
  state_ = ShardedState::kReleased;
}

void FlatParamGroup::reshard() {
  if (gathering_) {
    wait_gather();
    done_with_gathered();
  }
  // A filled reduction that will not finish (an error in backward): this step's gradients are
  // dropped, the sharded .grad set aside is put back.
  const bool dropped = reducing_;
  reducing_ = false;
  if (state_ == ShardedState::kSharded && !dropped) return;
  if (state_ != ShardedState::kSharded) point_at_shards();
  for (Member& m : params_) {
    m.param.mutable_grad() = m.shard_grad;
    m.shard_grad = at::Tensor();
  }
}

bool FlatParamGroup::holds_gradients_aside() const {
  for (const Member& m : params_) {
    if (m.shard_grad.defined() && m.shard_grad.ne(0).any().item<bool>()) return true;
  }
  return false;
}

std::vector<int64_t> FlatParamGroup::member_offsets() const {
  std::vector<int64_t> out;
  for (const Member& m : params_) out.push_back(m.offset);
  return out;
}

void FlatParamGroup::fill_reduce_input(const at::Tensor& input, int64_t member,
                                       const at::Tensor& incoming) {
  require_state(!reducing_, "fill_reduce_input");
  TORCH_CHECK(input.numel() == world_ * shard_numel_, "ddp: unit '", unit_name_,
              "': a reduce input of ", input.numel(), " elements for a (", world_, ", ",
              shard_numel_, ") layout");
  if (gathering_) {  // a prefetch that no backward used: complete it, it is matched on every rank
    wait_gather();
    done_with_gathered();
  }
  if (state_ == ShardedState::kSharded) {
    // Not gathered in this step (its forward did not run here): it still takes part, with zeros,
    // since the other ranks reduce it; its sharded .grad is set aside as unshard() would.
    for (Member& m : params_) {
      m.shard_grad = m.param.grad();
      m.param.mutable_grad() = at::Tensor();
    }
  }
  // Every element is written below: the padding rows and an absent gradient's block by zero_().
  const at::Tensor by_rank = input.view({world_, shard_numel_});
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  grads.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    Member& m = params_[i];
    at::Tensor grad = m.param.grad();
    if (static_cast<int64_t>(i) == member && incoming.defined()) {
      grad = grad.defined() ? grad + incoming : incoming;
    }
    m.param.mutable_grad() = at::Tensor();  // the full gradient is in the layout now
    if (grad.defined()) {
      TORCH_CHECK(grad.sizes().vec() == m.full_sizes, "ddp: unit '", unit_name_,
                  "': a gradient of shape ", grad.sizes(), " for a parameter of shape ",
                  at::IntArrayRef(m.full_sizes));
    }
    grads.push_back(std::move(grad));
  }
  std::vector<ReduceInputBlock> blocks;
  blocks.reserve(params_.size());
  for (const Member& m : params_) blocks.push_back({m.rows, m.chunk, m.row_numel});
  copy_into_reduce_input(by_rank, grads, blocks, world_);
  free_full();
  reducing_ = true;
}

void FlatParamGroup::finish_reduce_scatter(const at::Tensor& shard) {
  require_state(reducing_, "finish_reduce_scatter");
  TORCH_CHECK(shard.defined() && shard.numel() == shard_numel_, "ddp: unit '", unit_name_,
              "': a reduced shard of ", shard.defined() ? shard.numel() : 0,
              " elements for S = ", shard_numel_);
  at::Tensor reduced = shard;
  // Not a view of a larger temporary (Gloo's emulation), and in the shards' dtype.
  if (reduced.scalar_type() != shard_.scalar_type()) {
    reduced = reduced.to(shard_.scalar_type());
  } else if (reduced.storage().nbytes() > static_cast<size_t>(reduced.nbytes()) ||
             !reduced.is_contiguous()) {
    reduced = reduced.clone();
  }
  reducing_ = false;
  point_at_shards();
  at::NoGradGuard no_grad;
  for (Member& m : params_) {
    // Not a view (an alias through set_), so that zero_grad's detach_() works on it.
    at::Tensor mine = at::empty({0}, reduced.options());
    point(mine, reduced, m.offset, m.shard_sizes);
    if (m.shard_grad.defined()) mine = m.shard_grad.add_(mine);
    m.param.mutable_grad() = mine;
    m.shard_grad = at::Tensor();
  }
}

void FlatParamGroup::reduce_scatter_grads() {
  const at::Tensor input =
      at::empty({world_ * shard_numel_}, shard_.options().dtype(reduce_dtype()));
  fill_reduce_input(input, -1, at::Tensor());
  const comm::ForPurpose purpose({comm::Purpose::kUnitReduce, static_cast<int64_t>(unit_)});
  finish_reduce_scatter(pg_->reduce_scatter(input, comm::ReduceOp::kAvg,
                                            "reduce-scatter of unit '" + unit_name_ + "'"));
}

}  // namespace ddp::shard
