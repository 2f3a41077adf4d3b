#include "ddp/buckets/bucket_storage.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/detail/torch_compat.hpp"

namespace ddp::buckets {

BucketStorage::BucketStorage(const BucketPlan& plan, const std::vector<at::Tensor>& params,
                             BucketStorageOptions options) {
  TORCH_CHECK(options.pad_to_multiple >= 1,
              "ddp: BucketStorageOptions::pad_to_multiple must be >= 1, got ",
              options.pad_to_multiple);
  TORCH_CHECK(plan.bucket_of.size() == params.size(), "ddp: BucketStorage: the plan has ",
              plan.bucket_of.size(), " parameters, but ", params.size(), " were given");
  storage_.resize(plan.buckets.size());
  data_.resize(plan.buckets.size());
  slots_.resize(params.size());
  staged_slots_.resize(plan.buckets.size());
  staged_grads_.resize(plan.buckets.size());
  bucket_of_ = plan.bucket_of;
  in_place_ = options.reduce_staged_in_place;
  buckets_ = plan.buckets;
  for (const Bucket& spec : plan.buckets) {
    const int64_t multiple = options.pad_to_multiple;
    padded_.push_back((spec.numel + multiple - 1) / multiple * multiple);
  }
  for (const at::Tensor& p : params) param_sizes_.push_back(p.sizes().vec());
  if (in_place_) return;  // allocated when first needed
  for (size_t b = 0; b < buckets_.size(); ++b) materialize(b);
}

void BucketStorage::materialize(size_t b) {
  const Bucket& spec = buckets_[b];
  if (spec.sparse || storage_[b].defined()) return;
  at::NoGradGuard no_grad;
  storage_[b] = at::zeros({padded_[b]}, at::TensorOptions().dtype(spec.dtype).device(spec.device));
  data_[b] = storage_[b].narrow(0, 0, spec.numel);
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const size_t p = spec.params[i];
    at::Tensor slot = at::empty({0}, storage_[b].options());
    slot.set_(storage_[b].storage(), storage_[b].storage_offset() + spec.offsets[i],
              param_sizes_[p], c10::contiguous_strides(param_sizes_[p]));
    slots_[p] = slot;
  }
}

bool BucketStorage::holds(size_t p, const at::Tensor& grad) const {
  const at::Tensor& slot = slots_[p];
  return grad.defined() && slot.defined() && grad.data_ptr() == slot.data_ptr() &&
         grad.sizes() == slot.sizes() && grad.strides() == slot.strides() &&
         grad.scalar_type() == slot.scalar_type();
}

void BucketStorage::stage(size_t p, at::Tensor grad) {
  const size_t b = bucket_of_[p];
  TORCH_CHECK(!buckets_[b].sparse, "ddp: parameter ", p, " has no slot to stage a gradient for");
  staged_slots_[b].push_back(p);
  staged_grads_[b].push_back(std::move(grad));
}

void BucketStorage::fill(size_t b) {
  materialize(b);
  if (staged_grads_[b].empty()) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> slots;
  for (size_t p : staged_slots_[b]) slots.push_back(slots_[p]);
#if DDP_HAVE_FOREACH_COPY
  at::_foreach_copy_(slots, staged_grads_[b]);
#else
  for (size_t i = 0; i < staged_grads_[b].size(); ++i) slots[i].copy_(staged_grads_[b][i]);
#endif
  staged_slots_[b].clear();
  staged_grads_[b].clear();
}

std::vector<at::Tensor> BucketStorage::take_whole_staged(size_t b) {
  // A parameter stages at most once per backward (it is marked ready once), so a full count
  // means every parameter of the bucket is here.
  if (!in_place_ || staged_grads_[b].size() != buckets_[b].params.size()) return {};
  // A collective reduces contiguous memory (NCCL refuses other strides); a gradient that follows
  // a strided parameter's layout is copied into the bucket as before.
  for (const at::Tensor& g : staged_grads_[b]) {
    if (!g.is_contiguous()) return {};
  }
  std::vector<at::Tensor> grads = std::move(staged_grads_[b]);
  staged_grads_[b].clear();
  staged_slots_[b].clear();
  return grads;
}

void BucketStorage::drop_staged() {
  for (auto& v : staged_slots_) v.clear();
  for (auto& v : staged_grads_) v.clear();
}

void BucketStorage::adopt(size_t p, at::Tensor& grad, bool as_view) const {
  if (!grad.defined() || grad.is_sparse() || !slots_[p].defined()) return;
  at::NoGradGuard no_grad;
  slots_[p].copy_(grad);
  if (as_view) grad = slots_[p];
}

}  // namespace ddp::buckets
