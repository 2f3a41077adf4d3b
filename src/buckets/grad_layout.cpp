#include "ddp/buckets/grad_layout.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

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

void GradLayout::adopt(size_t p, at::Tensor& grad, bool as_view) const {
  if (!grad.defined() || grad.is_sparse() || !slots_[p].defined()) return;
  at::NoGradGuard no_grad;
  slots_[p].copy_(grad);
  if (as_view) grad = slots_[p];
}

}  // namespace ddp::buckets
