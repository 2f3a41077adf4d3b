#include "ddp/shard/flat_param_group.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/comm/flat_shards.hpp"

namespace ddp::shard {
namespace {

std::vector<int64_t> with_dim0(const std::vector<int64_t>& sizes, int64_t dim0) {
  std::vector<int64_t> out = sizes.empty() ? std::vector<int64_t>{1} : sizes;
  out[0] = dim0;
  return out;
}

// Points `param` at `sizes` (contiguous) elements of `source` from `offset`, keeping its identity.
void point(at::Tensor& param, const at::Tensor& source, int64_t offset,
           const std::vector<int64_t>& sizes) {
  at::NoGradGuard no_grad;  // set_ on a leaf that requires grad is not an autograd operation
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  param.set_(source.storage(), source.storage_offset() + offset, sizes, strides);
}

}  // namespace

FlatParamGroup::FlatParamGroup(const ShardPlan& plan, size_t unit,
                               const std::vector<at::Tensor>& params, comm::ProcessGroupPtr pg)
    : pg_(std::move(pg)), world_(plan.world) {
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
    if (s.placement != Placement::kShard) continue;
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
    m.rows = s.rows;
    m.chunk = s.chunk;
    m.row_numel = s.row_numel;
    m.full_sizes = with_dim0(plan.shapes[i].shape, s.rows);
    m.shard_sizes = with_dim0(plan.shapes[i].shape, s.chunk);
    m.offset = shard_numel_;
    shard_numel_ += s.local_numel();
    members_.push_back(i);
    params_.push_back(std::move(m));
  }
  const auto options = params_.empty() ? at::TensorOptions(at::kFloat) : params_[0].param.options();
  shard_ = at::zeros({shard_numel_}, options.requires_grad(false));
  at::NoGradGuard no_grad;
  for (Member& m : params_) {
    const int64_t rows_here = comm::FlatShards{m.rows, world_}.length(rank);
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

std::string FlatParamGroup::describe_state() const {
  return state_ == ShardedState::kSharded ? "sharded" : "unsharded";
}

void FlatParamGroup::require_state(ShardedState wanted, const char* operation) const {
  TORCH_CHECK(state_ == wanted, "ddp: unit '", unit_name_, "': ", operation, " needs the ",
              wanted == ShardedState::kSharded ? "sharded" : "unsharded", " state (it is ",
              describe_state(), ")");
}

void FlatParamGroup::point_at_shards() {
  for (Member& m : params_) {
    point(m.param, shard_, m.offset, m.shard_sizes);
    m.full = at::Tensor();
  }
  state_ = ShardedState::kSharded;
}

void FlatParamGroup::unshard() {
  if (state_ == ShardedState::kUnsharded) return;
  const at::Tensor gathered =
      pg_->all_gather(shard_, shard_numel_ * world_, "all-gather of unit '" + unit_name_ + "'");
  const at::Tensor by_rank = gathered.view({world_, shard_numel_});
  at::NoGradGuard no_grad;
  for (Member& m : params_) {
    const int64_t block = m.chunk * m.row_numel;
    m.full = at::empty({world_ * block}, shard_.options());
    m.full.view({world_, block}).copy_(by_rank.narrow(1, m.offset, block));
    point(m.param, m.full, 0, m.full_sizes);
    m.shard_grad = m.param.grad();
    m.param.mutable_grad() = at::Tensor();
  }
  state_ = ShardedState::kUnsharded;
}

void FlatParamGroup::reshard() {
  if (state_ == ShardedState::kSharded) return;
  point_at_shards();
  for (Member& m : params_) {
    m.param.mutable_grad() = m.shard_grad;
    m.shard_grad = at::Tensor();
  }
}

void FlatParamGroup::reduce_scatter_grads() {
  require_state(ShardedState::kUnsharded, "reduce_scatter_grads");
  // The (world, S) input of [Note: flat shard layout]; padding rows stay zero.
  at::Tensor input = at::zeros({world_ * shard_numel_}, shard_.options());
  const at::Tensor by_rank = input.view({world_, shard_numel_});
  for (Member& m : params_) {
    const at::Tensor& grad = m.param.grad();
    if (!grad.defined()) continue;
    TORCH_CHECK(grad.sizes().vec() == m.full_sizes, "ddp: unit '", unit_name_,
                "': a gradient of shape ", grad.sizes(), " for a parameter of shape ",
                at::IntArrayRef(m.full_sizes));
    // Rank k's rows straight into row k of the layout: one pass over the gradient, and the
    // padding rows keep the zeros `input` was made with.
    const at::Tensor rows = grad.reshape({m.rows, m.row_numel});
    const comm::FlatShards split{m.rows, world_};
    for (int k = 0; k < world_; ++k) {
      const int64_t n = split.length(k);
      if (n == 0) continue;
      by_rank[k]
          .narrow(0, m.offset, n * m.row_numel)
          .copy_(rows.narrow(0, split.offset(k), n).reshape({-1}));
    }
  }
  at::Tensor reduced = pg_->reduce_scatter(input, comm::ReduceOp::kAvg,
                                           "reduce-scatter of unit '" + unit_name_ + "'");
  // Gloo's emulation returns a view into a full-size temporary: keep only the shard alive.
  if (reduced.storage().nbytes() > static_cast<size_t>(reduced.nbytes())) reduced = reduced.clone();
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

}  // namespace ddp::shard
