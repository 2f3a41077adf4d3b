#pragma once
// GradLayout: where a plan's gradients live. One flat tensor per dense bucket, allocated once per
// plan (never per step), and per parameter a slot: a tensor shaped like the parameter that aliases
// its stretch of the flat storage. With bucket views (the default) the slot IS param.grad, so the
// autograd engine accumulates straight into the bucket and nothing is copied in or out.
//
//   bucket b storage  [ p3 .......... | p2 .... | p7 ..... | pad ]
//                       ^ slot(p3)      ^ slot(p2)           ^ zeros up to a multiple of
//                                                              pad_to_multiple (equal shards)
//
// Invariant: the padding is zero and stays zero (nothing writes it; reducing zeros gives zeros),
// so a reduce-scatter over the padded storage gives every rank an equal shard.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/buckets/bucket_buffers.hpp"
#include "ddp/buckets/bucket_plan.hpp"

namespace ddp::buckets {

struct LayoutOptions {
  // Default 1: no padding. Each bucket's storage is rounded up to a multiple of this many
  // elements, so that it splits into that many equal shards (the group size, for a
  // reduce-scatter). Must be >= 1.
  int64_t pad_to_multiple = 1;
};

class GradLayout : public BucketBuffers {
 public:
  GradLayout() = default;
  // `params[p]` gives slot p its shape; `plan` its bucket and offset.
  GradLayout(const BucketPlan& plan, const std::vector<at::Tensor>& params,
             LayoutOptions options = {});

  size_t num_buckets() const override { return storage_.size(); }
  // Bucket b's whole storage, padding included; undefined for a sparse bucket.
  const at::Tensor& storage(size_t b) const override { return storage_[b]; }
  // Bucket b's gradients without the padding: what a comm hook sees.
  const at::Tensor& data(size_t b) const override { return data_[b]; }
  // Parameter p's gradient inside its bucket, shaped like p; undefined for a sparse parameter.
  const at::Tensor& slot(size_t p) const { return slots_[p]; }
  // Whether `grad` is slot p itself (same memory, shape, strides and dtype). A grad that is not
  // was replaced (zero_grad(set_to_none), the accumulator stealing a fresh tensor) and must be
  // copied back into the bucket.
  bool holds(size_t p, const at::Tensor& grad) const;

  // Moves a gradient parameter p already holds into its slot; with `as_view` the slot becomes
  // p's grad. Used when a plan is built, so nothing accumulated (no_sync steps) is lost.
  void adopt(size_t p, at::Tensor& grad, bool as_view) const;

 private:
  std::vector<at::Tensor> storage_;  // per bucket
  std::vector<at::Tensor> data_;     // per bucket: storage_ without padding
  // Per parameter. Made with set_() rather than view ops so a slot is not an autograd view
  // (Optimizer::zero_grad's detach_ accepts it).
  std::vector<at::Tensor> slots_;
};

}  // namespace ddp::buckets
