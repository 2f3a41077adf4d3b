#include "ddp/buckets/grad_layout.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/detail/torch_compat.hpp"

namespace ddp::buckets {

GradLayout::GradLayout(const BucketPlan& plan, const std::vector<at::Tensor>& params,
                       LayoutOptions options) {
  TORCH_CHECK(options.pad_to_multiple >= 1,
              "ddp: LayoutOptions::pad_to_multiple must be >= 1, got ", options.pad_to_multiple);
  TORCH_CHECK(plan.bucket_of.size() == params.size(), "ddp: GradLayout: the plan has ",
              plan.bucket_of.size(), " parameters, but ", params.size(), " were given");
  at::NoGradGuard no_grad;
  storage_.resize(plan.buckets.size());
  data_.resize(plan.buckets.size());
  slots_.resize(params.size());
  staged_slots_.resize(plan.buckets.size());
  staged_grads_.resize(plan.buckets.size());
  bucket_of_ = plan.bucket_of;
  in_place_ = options.reduce_staged_in_place;
  for (const Bucket& spec : plan.buckets) bucket_params_.push_back(spec.params.size());
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const Bucket& spec = plan.buckets[b];
    if (spec.sparse) continue;
    const int64_t multiple = options.pad_to_multiple;
    const int64_t padded = (spec.numel + multiple - 1) / multiple * multiple;
    storage_[b] = at::zeros({padded}, at::TensorOptions().dtype(spec.dtype).device(spec.device));
    data_[b] = storage_[b].narrow(0, 0, spec.numel);
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const size_t p = spec.params[i];
      at::Tensor slot = at::empty({0}, storage_[b].options());
      slot.set_(storage_[b].storage(), storage_[b].storage_offset() + spec.offsets[i],
                params[p].sizes(), c10::contiguous_strides(params[p].sizes()));
      slots_[p] = slot;
    }
  }
}

bool GradLayout::holds(size_t p, const at::Tensor& grad) const {
  const at::Tensor& slot = slots_[p];
  return grad.defined() && slot.defined() && grad.data_ptr() == slot.data_ptr() &&
         grad.sizes() == slot.sizes() && grad.strides() == slot.strides() &&
         grad.scalar_type() == slot.scalar_type();
}

void GradLayout::stage(size_t p, at::Tensor grad) {
  TORCH_CHECK(slots_[p].defined(), "ddp: parameter ", p, " has no slot to stage a gradient for");
  const size_t b = bucket_of_[p];
  staged_slots_[b].push_back(slots_[p]);
  staged_grads_[b].push_back(std::move(grad));
}

void GradLayout::fill(size_t b) {
  if (staged_grads_[b].empty()) return;
  at::NoGradGuard no_grad;
#if DDP_HAVE_FOREACH_COPY
  at::_foreach_copy_(staged_slots_[b], staged_grads_[b]);
#else
  for (size_t i = 0; i < staged_grads_[b].size(); ++i)
    staged_slots_[b][i].copy_(staged_grads_[b][i]);
#endif
  staged_slots_[b].clear();
  staged_grads_[b].clear();
}

std::vector<at::Tensor> GradLayout::take_whole_staged(size_t b) {
  // A parameter stages at most once per backward (it is marked ready once), so a full count
  // means every parameter of the bucket is here.
  if (!in_place_ || staged_grads_[b].size() != bucket_params_[b]) return {};
  std::vector<at::Tensor> grads = std::move(staged_grads_[b]);
  staged_grads_[b].clear();
  staged_slots_[b].clear();
  return grads;
}

void GradLayout::drop_staged() {
  for (auto& v : staged_slots_) v.clear();
  for (auto& v : staged_grads_) v.clear();
}

void GradLayout::adopt(size_t p, at::Tensor& grad, bool as_view) const {
  if (!grad.defined() || grad.is_sparse() || !slots_[p].defined()) return;
  at::NoGradGuard no_grad;
  slots_[p].copy_(grad);
  if (as_view) grad = slots_[p];
}

}  // namespace ddp::buckets
