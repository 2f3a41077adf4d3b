#include "ddp/tp/parallelize.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/tp/region_ops.hpp"

namespace ddp::tp {
namespace {

// `param` becomes `value` (a new contiguous tensor), keeping its identity.
void replace_with(at::Tensor& param, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  param.set_(value.contiguous().clone());
}

}  // namespace

const char* style_name(TpStyle style) {
  return style == TpStyle::kColwise ? "ColwiseParallel" : "RowwiseParallel";
}

TensorParallel::TensorParallel(std::shared_ptr<torch::nn::Module> module,
                               comm::ProcessGroupPtr group, const TpPlan& plan)
    : module_(std::move(module)), group_(std::move(group)) {
  TORCH_CHECK(module_, "ddp: parallelize_module needs a module");
  TORCH_CHECK(group_, "ddp: parallelize_module needs a process group");
  const int64_t n = group_->world_size(), r = group_->rank();
  const auto modules = module_->named_modules(/*name_prefix=*/"", /*include_self=*/false);
  for (const auto& [name, style] : plan) {
    const auto* found = modules.find(name);
    if (found == nullptr) {
      std::string linears;
      for (const auto& item : modules) {
        if (item.value()->as<torch::nn::Linear>() != nullptr) {
          linears += (linears.empty() ? "" : ", ") + item.key();
        }
      }
      TORCH_CHECK(false, "ddp: the tensor-parallel plan names '", name,
                  "', which is not a submodule of the model (its Linear submodules: ",
                  linears.empty() ? "none" : linears, ")");
    }
    auto* linear = (*found)->as<torch::nn::Linear>();
    TORCH_CHECK(linear != nullptr, "ddp: ", style_name(style), " on '", name,
                "': it is not a torch::nn::Linear");
    const int64_t out = linear->weight.size(0), in = linear->weight.size(1);
    const bool colwise = style == TpStyle::kColwise;
    const int64_t split = colwise ? out : in;
    TORCH_CHECK(split % n == 0, "ddp: ", style_name(style), " on '", name,
                "': ", colwise ? "out_features " : "in_features ", split,
                " does not divide by the tp size ", n);
    // Every tp rank slices the same full weight: rank 0's.
    group_->broadcast(linear->weight, 0, "tensor-parallel broadcast of '" + name + ".weight'");
    if (linear->bias.defined()) {
      group_->broadcast(linear->bias, 0, "tensor-parallel broadcast of '" + name + ".bias'");
    }
    Planned p{name, style, linear, at::Tensor()};
    if (colwise) {
      replace_with(linear->weight, linear->weight.detach().narrow(0, r * (out / n), out / n));
      shard_dims_[name + ".weight"] = 0;
      if (linear->bias.defined()) {
        replace_with(linear->bias, linear->bias.detach().narrow(0, r * (out / n), out / n));
        shard_dims_[name + ".bias"] = 0;
      }
    } else {
      replace_with(linear->weight, linear->weight.detach().narrow(1, r * (in / n), in / n));
      shard_dims_[name + ".weight"] = 1;
      p.bias = linear->bias;
    }
    registrations_.push_back(std::make_unique<shard::UnitRegistration>(
        *linear, static_cast<shard::UnitListener&>(*this), planned_.size()));
    planned_.push_back(std::move(p));
  }
}

TensorParallel::~TensorParallel() = default;

at::Tensor TensorParallel::before_unit_forward(size_t unit, const at::Tensor& input) {
  Planned& p = planned_[unit];
  if (p.style == TpStyle::kColwise) return copy_to_region(input, group_);
  const int64_t local = p.linear->weight.size(1);
  const int64_t full = local * group_->world_size();
  TORCH_CHECK(input.size(-1) == local || input.size(-1) == full, "ddp: RowwiseParallel '", p.name,
              "' takes a last dim of ", local, " (sharded) or ", full, " (replicated), got ",
              input.sizes());
  // The bias is added once, after the partial products are summed.
  p.linear->bias = at::Tensor();
  return input.size(-1) == local ? input : scatter_last_dim(input, group_);
}

at::Tensor TensorParallel::after_unit_forward(size_t unit, const at::Tensor& output) {
  Planned& p = planned_[unit];
  if (p.style == TpStyle::kColwise) return output;
  p.linear->bias = p.bias;
  at::Tensor out = reduce_from_region(output, group_);
  return p.bias.defined() ? out + p.bias : out;
}

int64_t TensorParallel::shard_dim(const std::string& name) const {
  const auto it = shard_dims_.find(name);
  return it == shard_dims_.end() ? -1 : it->second;
}

at::Tensor TensorParallel::full(const std::string& name, const at::Tensor& local) const {
  const int64_t dim = shard_dim(name);
  if (dim < 0) return local.detach().clone();
  return gather_along(local, dim, group_);
}

std::vector<std::pair<std::string, at::Tensor>> TensorParallel::full_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), full(item.key(), item.value()));
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> TensorParallel::local_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value().detach());
  }
  return out;
}

std::unique_ptr<TensorParallel> parallelize_module(std::shared_ptr<torch::nn::Module> module,
                                                   comm::ProcessGroupPtr group,
                                                   const TpPlan& plan) {
  return std::make_unique<TensorParallel>(std::move(module), std::move(group), plan);
}

}  // namespace ddp::tp
