#include "ddp/tp/parallelize.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/comm/broadcast_coalesced.hpp"
#include "ddp/tp/region_ops.hpp"

namespace ddp::tp {
namespace {

// `param` becomes `value` (a new contiguous tensor), keeping its identity.
void replace_with(at::Tensor& param, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  param.set_(value.contiguous().clone());
}

// Rank r's rows of `full` (dim 0 of `packed` equal chunks, each split in n).
at::Tensor packed_rows(const at::Tensor& full, int64_t packed, int64_t n, int64_t r) {
  const int64_t chunk = full.size(0) / packed, mine = chunk / n;
  std::vector<at::Tensor> pieces;
  for (int64_t c = 0; c < packed; ++c) pieces.push_back(full.narrow(0, c * chunk + r * mine, mine));
  return at::cat(pieces, 0);
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
  // Checked first, so that a bad plan fails before any collective, the same on every rank.
  for (bool apply : {false, true}) {
    if (apply) {
      // Every tp rank starts from rank 0's values: the planned weights are sliced from the same
      // full tensors, and the replicated parameters must be equal for their gradients to be.
      std::vector<at::Tensor> params;
      for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
        bool seen = false;
        for (const auto& p : params) seen = seen || p.is_same(item.value());
        if (!seen) params.push_back(item.value());
      }
      comm::broadcast_coalesced(*group_, params, 0,
                                "tensor-parallel broadcast of rank 0's parameters");
    }
    for (const auto& [name, spec] : plan) {
      const TpStyle style = spec.style;
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
      const int64_t packed = colwise ? spec.packed : 1;
      TORCH_CHECK(spec.packed >= 1 && (colwise || spec.packed == 1), "ddp: ", style_name(style),
                  " on '", name, "': packed ", spec.packed, " (colwise only, >= 1)");
      const int64_t split = colwise ? out : in;
      TORCH_CHECK(split % (n * packed) == 0, "ddp: ", style_name(style), " on '", name,
                  "': ", colwise ? "out_features " : "in_features ", split,
                  packed > 1 ? " in " + std::to_string(packed) + " packed chunks" : std::string(),
                  " does not divide by the tp size ", n);
      if (!apply) continue;  // the first pass only checks
      Planned p{name, spec, linear, at::Tensor()};
      if (colwise) {
        replace_with(linear->weight, packed_rows(linear->weight.detach(), packed, n, r));
        splits_[name + ".weight"] = Split{0, packed};
        if (linear->bias.defined()) {
          replace_with(linear->bias, packed_rows(linear->bias.detach(), packed, n, r));
          splits_[name + ".bias"] = Split{0, packed};
        }
      } else {
        replace_with(linear->weight, linear->weight.detach().narrow(1, r * (in / n), in / n));
        splits_[name + ".weight"] = Split{1, 1};
        p.bias = linear->bias;
      }
      registrations_.push_back(std::make_unique<shard::UnitRegistration>(
          *linear, static_cast<shard::UnitListener&>(*this), planned_.size()));
      planned_.push_back(std::move(p));
    }
  }
}

TensorParallel::~TensorParallel() = default;

at::Tensor TensorParallel::before_unit_forward(size_t unit, const at::Tensor& input) {
  Planned& p = planned_[unit];
  if (p.style.style == TpStyle::kColwise) return copy_to_region(input, group_);
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
  if (p.style.style == TpStyle::kColwise) return output;
  p.linear->bias = p.bias;
  at::Tensor out = reduce_from_region(output, group_);
  return p.bias.defined() ? out + p.bias : out;
}

int64_t TensorParallel::shard_dim(const std::string& name) const {
  const auto it = splits_.find(name);
  return it == splits_.end() ? -1 : it->second.dim;
}

at::Tensor TensorParallel::full(const std::string& name, const at::Tensor& local) const {
  const auto it = splits_.find(name);
  if (it == splits_.end()) return local.detach().clone();
  const Split& split = it->second;
  const at::Tensor whole = gather_along(local, split.dim, group_);
  if (split.packed == 1) return whole;
  // [rank 0's chunks | rank 1's chunks | ...] -> [chunk 0 of every rank | chunk 1 ...].
  const int64_t n = group_->world_size(), piece = local.size(0) / split.packed;
  std::vector<int64_t> sizes{n, split.packed, piece};
  for (int64_t d = 1; d < local.dim(); ++d) sizes.push_back(local.size(d));
  return whole.reshape(sizes).transpose(0, 1).reshape(whole.sizes());
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
