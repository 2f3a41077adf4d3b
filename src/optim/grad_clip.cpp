#include "ddp/optim/grad_clip.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <unordered_set>

#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/comm/sharding/layout_tensors.hpp"
#include "ddp/detail/torch_compat.hpp"
#include "ddp/obs/log.hpp"

namespace ddp::optim {
namespace {

bool is_inf_norm(double norm_type) { return std::isinf(norm_type) && norm_type > 0; }

// The mesh dims a layout splits, ascending.
std::vector<int> split_dims(const layout::Layout& layout) {
  std::vector<int> dims;
  for (const auto& p : layout.placements) {
    if (p.kind == layout::Placement::Kind::kShard) dims.push_back(p.mesh_dim);
  }
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  return dims;
}

// Whether every gradient is an fp32 tensor on one CUDA device: then PyTorch 2.x's clip_grad_norm_
// norms and scales them with multi-tensor kernels (one launch for all instead of one each).
bool on_cuda_in_fp32(const std::vector<at::Tensor>& grads) {
  for (const auto& g : grads) {
    if (!g.is_cuda() || g.scalar_type() != at::kFloat || g.device() != grads.front().device()) {
      return false;
    }
  }
  return !grads.empty();
}

// The norm of `grads` alone, a 0-d float tensor on `device`, computed as PyTorch's
// clip_grad_norm_ does (each gradient's norm, then the norm of their stack, in fp32), so that
// where nothing is split (DDP, one process) the norm and the clipped gradients are bit for bit
// PyTorch's: Adam turns rounding differences in near-zero gradients into visible updates.
at::Tensor partial(const std::vector<at::Tensor>& grads, bool inf, const c10::Device& device) {
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device);
  if (grads.empty()) return at::zeros({}, fp32);
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  const at::Scalar ord =
      inf ? at::Scalar(std::numeric_limits<double>::infinity()) : at::Scalar(2.0);
  if (on_cuda_in_fp32(grads) && grads.front().device() == device) {
    // One multi-tensor kernel, as clip_grad_norm_ takes them on CUDA since torch 2.0.
    norms = at::_foreach_norm(grads, ord);
  } else {
    for (const auto& g : grads) {
      // Low-precision gradients are normed in fp32 (PyTorch's would be in their own dtype).
      const at::Tensor norm =
          g.scalar_type() == at::kFloat ? at::norm(g, ord) : at::norm(g.to(at::kFloat), ord);
      norms.push_back(norm.to(fp32));
    }
  }
  return at::norm(at::stack(norms), ord);
}

}  // namespace

const char* non_finite_name(NonFinite policy) {
  switch (policy) {
    case NonFinite::kError:
      return "error";
    case NonFinite::kSkip:
      return "skip";
  }
  return "?";
}

NonFinite non_finite_from_name(const std::string& name) {
  if (name == "error") return NonFinite::kError;
  if (name == "skip") return NonFinite::kSkip;
  TORCH_CHECK(false, "ddp: unknown non-finite gradient policy '", name, "'; valid: error, skip");
}

std::string clip_error(const ClipOptions& options) {
  std::ostringstream out;
  if (!(options.max_norm > 0) || std::isinf(options.max_norm)) {
    out << "--grad-clip must be a positive number (the largest total gradient norm), got "
        << options.max_norm;
  } else if (options.norm_type != 2.0 && !is_inf_norm(options.norm_type)) {
    out << "the gradient norm must be the 2-norm or the inf-norm, got norm type "
        << options.norm_type;
  }
  return out.str();
}

GradShards grad_shards(torch::nn::Module& module, const layout::TensorLayouts* layouts,
                       std::vector<comm::ProcessGroupPtr> groups) {
  const layout::TensorLayouts whole;  // mesh {1}: every gradient whole
  const layout::TensorLayouts& split = layouts != nullptr ? *layouts : whole;
  TORCH_CHECK(groups.empty() || groups.size() == split.mesh.size(),
              "ddp: grad_shards: ", groups.size(), " groups for a mesh of ", split.mesh.size(),
              " dims: pass this rank's group along each mesh dim");
  groups.resize(split.mesh.size());
  for (size_t d = 0; d < groups.size(); ++d) {
    TORCH_CHECK(!groups[d] || groups[d]->world_size() == split.mesh[d],
                "ddp: grad_shards: mesh dim ", d, " has ", split.mesh[d],
                " ranks but its group has ", groups[d] ? groups[d]->world_size() : 0);
  }
  GradShards out;
  out.groups = std::move(groups);
  std::unordered_set<const void*> seen;  // a tied parameter is one tensor under two names
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    const layout::Layout layout = split.of(item.key(), p.sizes().vec());
    std::vector<int> dims = split_dims(layout);
    for (int d : dims) {
      TORCH_CHECK(split.mesh[d] == 1 || out.groups[d], "ddp: grad_shards: parameter '", item.key(),
                  "' is split over mesh dim ", d, " but no group was given for it");
    }
    if (std::find(out.sets.begin(), out.sets.end(), dims) == out.sets.end()) {
      out.sets.push_back(dims);
    }
    if (!p.requires_grad() || !p.grad().defined()) continue;
    at::Tensor grad = comm::real_local(layout, p.grad(), split.coordinate,
                                       "the gradient of '" + item.key() + "'");
    out.entries.push_back({item.key(), std::move(grad), std::move(dims)});
  }
  std::sort(out.sets.begin(), out.sets.end());
  return out;
}

GradShards grad_shards(torch::nn::Module& module, const comm::Sharding& sharding) {
  comm::check_sharding(sharding, "grad_shards");
  return grad_shards(module, &sharding.layouts, sharding.groups);
}

at::Tensor total_grad_norm(const GradShards& grads, double norm_type) {
  const bool inf = is_inf_norm(norm_type);
  TORCH_CHECK(inf || norm_type == 2.0, "ddp: total_grad_norm: norm type ", norm_type,
              " is neither 2 nor inf");
  c10::Device device = c10::kCPU;
  if (!grads.entries.empty()) {
    device = grads.entries.front().grad.device();
  } else {
    for (const auto& g : grads.groups) {
      if (g) device = g->device();
    }
  }
  // One partial norm per set of mesh dims ([Note: a norm over layouts]).
  std::vector<at::Tensor> partials;
  for (const auto& set : grads.sets) {
    std::vector<at::Tensor> mine;
    for (const auto& e : grads.entries) {
      if (e.sharded_over == set) mine.push_back(e.grad);
    }
    partials.push_back(partial(mine, inf, device));
  }
  // Split sets: their squares (2-norm) are summed over the ranks, in fp64 on the wire, then the
  // root taken again; the inf-norm's maxima need no squaring.
  std::vector<bool> squared(partials.size(), false);
  for (size_t d = 0; d < grads.groups.size(); ++d) {
    const comm::ProcessGroupPtr& group = grads.groups[d];
    if (!group || group->world_size() == 1) continue;
    std::vector<size_t> over;
    for (size_t k = 0; k < grads.sets.size(); ++k) {
      const auto& set = grads.sets[k];
      if (std::find(set.begin(), set.end(), static_cast<int>(d)) != set.end()) over.push_back(k);
    }
    if (over.empty()) continue;
    std::vector<at::Tensor> parts;
    for (size_t k : over) {
      at::Tensor part = partials[k].to(at::kDouble);
      if (!inf && !squared[k]) part = part * part;
      squared[k] = !inf;
      parts.push_back(part);
    }
    const std::string what = "clip_grad_norm over mesh dim " + std::to_string(d);
    at::Tensor packed = at::stack(parts).to(group->device());
    const comm::ForPurpose purpose({comm::Purpose::kControl});
    if (inf) {
      // No max all-reduce in comm/: gather every rank's partials (a few scalars) and take the max.
      packed = at::stack(group->all_gather_each(packed, what)).amax(0);
    } else {
      group->allreduce_sum(packed, what);
    }
    packed = packed.to(device);
    for (size_t i = 0; i < over.size(); ++i) partials[over[i]] = packed[static_cast<int64_t>(i)];
  }
  for (size_t k = 0; k < partials.size(); ++k) {
    if (squared[k]) partials[k] = partials[k].sqrt();
    partials[k] = partials[k].to(at::kFloat);
  }
  if (partials.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  // One set (DDP, one process, TP alone without replicated parameters): its norm as it is.
  if (partials.size() == 1) return partials.front();
  return at::norm(at::stack(partials),
                  inf ? at::Scalar(std::numeric_limits<double>::infinity()) : at::Scalar(2.0));
}

namespace {

// The clip itself, on the device; the policy is the caller's.
ClipResult clip_on_device(const GradShards& grads, const ClipOptions& options) {
  const std::string wrong = clip_error(options);
  TORCH_CHECK(wrong.empty(), "ddp: clip_grad_norm: ", wrong);
  ClipResult result;
  result.total_norm = total_grad_norm(grads, options.norm_type);
  const at::Tensor finite = at::isfinite(result.total_norm);
  result.nonfinite = at::logical_not(finite).to(at::kFloat);
  // PyTorch's coefficient, op for op (max_norm / t is t.reciprocal() * max_norm in Python), in
  // fp32 and clamped at 1: multiplying by 1 changes nothing, so a small norm leaves every bit. A
  // non-finite norm multiplies by 1 too: the gradients stay as they were for the caller to see.
  const at::Tensor coef = at::where(
      finite, ((result.total_norm + 1e-6).reciprocal() * options.max_norm).clamp_max(1.0), 1.0);
  std::vector<at::Tensor> all;
  for (const auto& e : grads.entries) all.push_back(e.grad);
#if DDP_HAVE_FOREACH_TENSOR_SCALE
  if (on_cuda_in_fp32(all) && all.front().device() == coef.device()) {
    at::_foreach_mul_(all, coef);
    return result;
  }
#endif
  for (const auto& g : all) g.mul_(coef.to(g.device()));
  return result;
}

}  // namespace

double ClipResult::norm() const { return total_norm.item<double>(); }
bool ClipResult::skipped() const { return nonfinite.item<float>() > 0; }

ClipResult clip_grad_norm(const GradShards& grads, const ClipOptions& options, int64_t step) {
  ClipResult result = clip_on_device(grads, options);
  if (options.non_finite == NonFinite::kError && result.skipped()) {
    TORCH_CHECK(false, "ddp: clip_grad_norm: the total gradient norm is ", result.norm(),
                step >= 0 ? " at step " + std::to_string(step) : std::string(),
                ": a gradient holds nan or inf (lower the learning rate, or skip such steps with "
                "the non-finite policy 'skip')");
  }
  return result;
}

GradClipper::GradClipper(ClipOptions options, c10::Device device, int64_t first_step)
    : options_(options) {
  const std::string wrong = clip_error(options_);
  TORCH_CHECK(wrong.empty(), "ddp: GradClipper: ", wrong);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const auto f64 = f32.dtype(at::kDouble);
  norm_ = at::zeros({}, f32);
  flag_ = at::zeros({}, f32);
  first_bad_norm_ = at::zeros({}, f32);
  skipped_ = at::zeros({}, f64);
  step_ = at::full({}, static_cast<double>(first_step - 1), f64);
  first_bad_step_ = at::full({}, -1.0, f64);
}

void GradClipper::clip(const GradShards& grads) {
  const ClipResult result = clip_on_device(grads, options_);
  at::NoGradGuard no_grad;
  norm_.copy_(result.total_norm);
  flag_.copy_(result.nonfinite);
  step_.add_(1);
  skipped_.add_(flag_);
  const at::Tensor first = at::logical_and(flag_ > 0, first_bad_step_ < 0);
  first_bad_step_.copy_(at::where(first, step_, first_bad_step_));
  first_bad_norm_.copy_(at::where(first, norm_, first_bad_norm_));
}

double GradClipper::last_norm() const { return norm_.item<double>(); }

int64_t GradClipper::skipped_steps() const { return static_cast<int64_t>(skipped_.item<double>()); }

void GradClipper::check() {
  const int64_t skipped = skipped_steps();
  if (skipped == reported_) return;
  const int64_t first = static_cast<int64_t>(first_bad_step_.item<double>());
  const double norm = first_bad_norm_.item<double>();
  TORCH_CHECK(options_.non_finite == NonFinite::kSkip,
              "ddp: clip_grad_norm: the total gradient norm is ", norm, " at step ", first,
              ": a gradient holds nan or inf (lower the learning rate, or skip such steps with "
              "the non-finite policy 'skip'); that step changed nothing");
  reported_ = skipped;
  std::ostringstream line;
  line << "ddp: " << skipped << " step" << (skipped == 1 ? "" : "s")
       << " skipped so far: the total gradient norm was not finite (the first at step " << first
       << ", norm " << norm << ")";
  obs::log(obs::LogLevel::kWarn, 0, line.str());
}

}  // namespace ddp::optim
