#include "ddp/tp/parallelize.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <sstream>

#include "ddp/autograd/accumulation_hook.hpp"
#include "ddp/autograd/end_of_backward.hpp"
#include "ddp/buckets/bucket_table.hpp"
#include "ddp/comm/sharding/layout_tensors.hpp"
#include "ddp/intake/module_intake.hpp"
#include "ddp/tp/region_ops.hpp"

namespace ddp::tp {
namespace {}  // namespace

const char* tp_style_name(TpStyle style) {
  return style == TpStyle::kColwise ? "ColwiseParallel" : "RowwiseParallel";
}

namespace {

std::string packed_style(const ParallelStyle& spec) {
  return std::string(tp_style_name(spec.style)) +
         (spec.packed > 1 ? " (packed " + std::to_string(spec.packed) + ")" : "");
}

std::string shape_text(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

}  // namespace

TensorParallel::TensorParallel(std::shared_ptr<torch::nn::Module> module,
                               comm::ProcessGroupPtr group, const TpPlan& plan)
    : module_(std::move(module)), group_(std::move(group)) {
  TORCH_CHECK(module_, "ddp: parallelize_module needs a module");
  TORCH_CHECK(group_, "ddp: parallelize_module needs a process group");
  const auto modules = module_->named_modules(/*name_prefix=*/"", /*include_self=*/false);
  // Every entry is checked before anything is communicated or changed: a bad plan fails the same
  // way on every rank and leaves the model as it was.
  std::vector<torch::nn::Module*> targets;
  for (const auto& [name, spec] : plan) targets.push_back(&check_entry(modules, name, spec));
  // Every tp rank starts from rank 0's values: the planned weights are sliced from the same full
  // tensors, and the replicated parameters must be equal for their gradients to be.
  intake::synchronize_replicas(*group_, intake::take_in(*module_), "parallelize_module");
  for (size_t i = 0; i < plan.size(); ++i) apply_entry(plan[i].first, plan[i].second, *targets[i]);
  // The parameters the plan does not split are replicated, from their shapes now (a runtime that
  // splits the shards again, FULLY_SHARD, changes the shapes the parameters have between steps
  // later). A tied parameter (an embedding shared with the output layer) is split under every
  // name, so that full() and local() of either name agree with the one tensor.
  const auto named = module_->named_parameters(/*recurse=*/true);
  for (const auto& item : named) {
    if (layouts_.by_name.count(item.key()) != 0) continue;
    layout::Layout out{item.value().sizes().vec(), {group_->world_size()}, {}};
    for (const auto& other : named) {
      const auto it = layouts_.by_name.find(other.key());
      if (it != layouts_.by_name.end() && other.value().is_same(item.value())) {
        out = it->second;
        if (styles_.count(other.key()) != 0) styles_[item.key()] = styles_.at(other.key());
        break;
      }
    }
    layouts_.by_name[item.key()] = out;
  }
  layouts_.mesh = {group_->world_size()};
  layouts_.coordinate = {group_->rank()};
}

torch::nn::Module& TensorParallel::check_entry(
    const torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>& modules,
    const std::string& name, const ParallelStyle& spec) const {
  const int64_t n = group_->world_size();
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
  const bool colwise = spec.style == TpStyle::kColwise;
  if (auto* embedding = (*found)->as<torch::nn::Embedding>()) {
    // RowwiseParallel on an Embedding splits the vocabulary (PyTorch's meaning too).
    TORCH_CHECK(!colwise && spec.packed == 1, "ddp: ", tp_style_name(spec.style), " on '", name,
                "': an Embedding takes RowwiseParallel (the vocabulary split) only");
    const int64_t vocab = embedding->weight.size(0);
    TORCH_CHECK(vocab % n == 0, "ddp: RowwiseParallel on '", name, "': num_embeddings ", vocab,
                " does not divide by the tp size ", n);
    return **found;
  }
  auto* linear = (*found)->as<torch::nn::Linear>();
  TORCH_CHECK(linear != nullptr, "ddp: ", tp_style_name(spec.style), " on '", name,
              "': it is not a torch::nn::Linear or Embedding");
  TORCH_CHECK(spec.packed >= 1 && (colwise || spec.packed == 1), "ddp: ", tp_style_name(spec.style),
              " on '", name, "': packed ", spec.packed, " (colwise only, >= 1)");
  const int64_t split = colwise ? linear->weight.size(0) : linear->weight.size(1);
  TORCH_CHECK(
      split % (n * spec.packed) == 0, "ddp: ", tp_style_name(spec.style), " on '", name,
      "': ", colwise ? "out_features " : "in_features ", split,
      spec.packed > 1 ? " in " + std::to_string(spec.packed) + " packed chunks" : std::string(),
      " does not divide by the tp size ", n);
  return **found;
}

void TensorParallel::apply_entry(const std::string& name, const ParallelStyle& spec,
                                 torch::nn::Module& target) {
  const int64_t n = group_->world_size(), r = group_->rank();
  Planned p;
  p.name = name;
  p.style = spec;
  if (auto* embedding = target.as<torch::nn::Embedding>()) {
    const int64_t rows = embedding->weight.size(0) / n;
    split(name + ".weight", embedding->weight, 0, 1, "RowwiseParallel (vocabulary)");
    p.embedding = embedding;
    p.first_row = r * rows;
    p.params = {embedding->weight};
    p.param_names = {name + ".weight"};
  } else {
    auto* linear = target.as<torch::nn::Linear>();
    p.linear = linear;
    if (spec.style == TpStyle::kColwise) {
      split(name + ".weight", linear->weight, 0, spec.packed, packed_style(spec));
      if (linear->bias.defined()) {
        split(name + ".bias", linear->bias, 0, spec.packed, packed_style(spec));
      }
      // Its bias is split like the weight: both are wrong when the module is called directly.
      p.params = {linear->weight};
      p.param_names = {name + ".weight"};
      if (linear->bias.defined()) {
        p.params.push_back(linear->bias);
        p.param_names.push_back(name + ".bias");
      }
    } else {
      split(name + ".weight", linear->weight, 1, 1, tp_style_name(spec.style));
      p.bias = linear->bias;
      // The replicated bias is added after the all-reduce; only the weight's gradient is wrong
      // (a partial sum reaches everything below it) when the module is called directly.
      p.params = {linear->weight};
      p.param_names = {name + ".weight"};
    }
  }
  registrations_.push_back(std::make_unique<unit::UnitRegistration>(
      target, static_cast<unit::UnitListener&>(*this), planned_.size()));
  planned_.push_back(std::move(p));
  watch_gradients(planned_.size() - 1);
}

void TensorParallel::watch_gradients(size_t unit) {
  Planned& p = planned_[unit];
  for (const at::Tensor& param : p.params) {
    if (!param.requires_grad()) continue;  // frozen: no gradient to check
    // A tensor hook, installed once: it stays through a sharded wrapper's set_() of the
    // parameter ([Note: hooks that survive set_], gradients/unit_buckets.hpp), and runs once a
    // backward ([Note: a leaf's hook runs once per accumulation]).
    p.hook_ids.emplace_back(param,
                            autograd::add_accumulation_hook(
                                param, [this, unit](const at::Tensor&) { on_gradient(unit); }));
  }
}

void TensorParallel::on_gradient(size_t unit) {
  Planned& p = planned_[unit];
  // [Note: a planned module called directly]
  TORCH_CHECK(p.forwards > 0, "ddp: tensor-parallel module '", p.name, "' (", packed_style(p.style),
              ") got a gradient in a backward after no forward through ddp::unit::run_unit: "
              "called directly, it skips the tensor-parallel collectives and its gradients are "
              "one rank's partial sums. Call it as ddp::unit::run_unit(*module, [&](const "
              "at::Tensor& x) { return module->forward(x); }, input) in the model's forward");
  if (end_queued_) return;
  end_queued_ = true;
  autograd::at_end_of_backward([this] {
    end_queued_ = false;
    for (Planned& q : planned_) q.forwards = std::max(0, q.forwards - 1);
  });
}

TensorParallel::~TensorParallel() {
  for (Planned& p : planned_) {
    for (auto& [param, id] : p.hook_ids) param.remove_hook(id);
  }
}

at::Tensor TensorParallel::before_unit_forward(size_t unit, const at::Tensor& input) {
  Planned& p = planned_[unit];
  if (at::GradMode::is_enabled()) {
    ++p.forwards;
  }
  if (p.embedding != nullptr) {
    // Ids outside this rank's rows look up row 0 and are zeroed after: the all-reduce then
    // sums exactly one real row per id.
    const int64_t rows = p.embedding->weight.size(0);
    p.outside = (input < p.first_row).logical_or(input >= p.first_row + rows);
    return (input - p.first_row).masked_fill(p.outside, 0);
  }
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
  if (p.embedding != nullptr) {
    const at::Tensor mine = output.masked_fill(p.outside.unsqueeze(-1), 0);
    p.outside = at::Tensor();
    return reduce_from_region(mine, group_);
  }
  if (p.style.style == TpStyle::kColwise) return output;
  p.linear->bias = p.bias;
  at::Tensor out = reduce_from_region(output, group_);
  return p.bias.defined() ? out + p.bias : out;
}

void TensorParallel::split(const std::string& name, at::Tensor& param, int64_t dim, int64_t packed,
                           const std::string& style) {
  const layout::Layout out{
      param.sizes().vec(), {group_->world_size()}, {layout::Placement::shard(0, dim, packed)}};
  {
    // take_local's tensor is new and contiguous: `param` becomes it, keeping its identity.
    at::NoGradGuard no_grad;
    param.set_(comm::take_local(out, param.detach(), {group_->rank()}));
  }
  layouts_.by_name[name] = out;
  styles_[name] = style;
}

int64_t TensorParallel::shard_dim(const std::string& name) const {
  const auto it = layouts_.by_name.find(name);
  if (it == layouts_.by_name.end() || it->second.placements.empty()) return -1;
  return it->second.placements[0].dim;
}

layout::Layout TensorParallel::layout(const std::string& name) const {
  const auto it = layouts_.by_name.find(name);
  TORCH_CHECK(it != layouts_.by_name.end(),
              "ddp: TensorParallel::layout: the module has no parameter '", name, "'");
  return it->second;
}

at::Tensor TensorParallel::full(const std::string& name, const at::Tensor& local) const {
  const auto it = layouts_.by_name.find(name);
  if (it == layouts_.by_name.end() || it->second.placements.empty()) {
    return local.detach().clone();
  }
  return comm::gather_whole(it->second, local.detach(), *group_, "the whole of '" + name + "'");
}

at::Tensor TensorParallel::local(const std::string& name, const at::Tensor& whole) const {
  const auto it = layouts_.by_name.find(name);
  if (it == layouts_.by_name.end() || it->second.placements.empty()) {
    return whole.detach().clone();
  }
  const layout::Placement& split = it->second.placements[0];
  const int64_t n = group_->world_size();
  TORCH_CHECK(
      whole.dim() > split.dim && whole.size(split.dim) % (n * split.packed) == 0,
      "ddp: tensor-parallel parameter '", name, "' is split on dim ", split.dim,
      split.packed > 1 ? " in " + std::to_string(split.packed) + " packed chunks" : std::string(),
      " over ", n, " ranks, but the whole tensor given has shape ", whole.sizes());
  return comm::take_local(it->second, whole.detach(), {group_->rank()});
}

std::string TensorParallel::table() const {
  std::vector<std::vector<std::string>> rows;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const auto it = styles_.find(item.key());
    if (it == styles_.end()) continue;
    rows.push_back({item.key(), it->second, shape_text(layouts_.by_name.at(item.key()).shape),
                    shape_text(item.value().sizes())});
  }
  return "Tensor-parallel split (tp size " + std::to_string(group_->world_size()) + ", " +
         std::to_string(rows.size()) + " parameters split, the others replicated)\n" +
         buckets::format_text_table({"Parameter", "Style", "Whole shape", "Local shape"}, rows,
                                    {false, false, false, false});
}

std::unique_ptr<TensorParallel> parallelize_module(std::shared_ptr<torch::nn::Module> module,
                                                   comm::ProcessGroupPtr group,
                                                   const TpPlan& plan) {
  return std::make_unique<TensorParallel>(std::move(module), std::move(group), plan);
}

}  // namespace ddp::tp
