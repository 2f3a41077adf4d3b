#pragma once
// BucketStorage: where a plan's gradients live. One flat tensor per dense bucket, allocated once
// per plan (never per step), and per parameter a slot: a tensor shaped like the parameter that
// aliases its stretch of the flat storage. With bucket views (the default) the slot IS param.grad,
// so the autograd engine accumulates straight into the bucket and nothing is copied in or out.
//
//   bucket b storage  [ p3 .......... | p2 .... | p7 ..... | pad ]
//                       ^ slot(p3)      ^ slot(p2)           ^ zeros up to a multiple of
//                                                              pad_to_multiple (equal shards)
//
// A gradient that arrives in a tensor of its own (after zero_grad(set_to_none), the usual case
// inside a captured step) is staged, not copied at once: fill(b), at the bucket's launch, copies
// all of bucket b's staged gradients in one multi-tensor copy ([Note: staged copies]).
//
// Invariant: the padding is zero and stays zero (nothing writes it; reducing zeros gives zeros),
// so a reduce-scatter over the padded storage gives every rank an equal shard.
//
// Under BucketStorageOptions::reduce_staged_in_place a bucket's storage (and its slots) is
// allocated only when first needed: fill(), or materialize() for a zero written straight into a
// slot. While every gradient is reduced where autograd put it, no bucket is ever allocated, and the
// model's gradients exist once, not twice; until then storage(b), data(b) and slot(p) are
// undefined.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/buckets/bucket_buffers.hpp"
#include "ddp/buckets/bucket_plan.hpp"

namespace ddp::buckets {

struct BucketStorageOptions {
  // Default 1: no padding. Each bucket's storage is rounded up to a multiple of this many
  // elements, so that it splits into that many equal shards (the group size, for a
  // reduce-scatter). Must be >= 1.
  int64_t pad_to_multiple = 1;
  // Default false: staged gradients are always copied into the storage (fill). True: a bucket
  // whose every gradient was staged hands them out to be reduced where they are
  // (take_whole_staged); the bucket group then leaves param.grad pointing at them, and a bucket's
  // storage is allocated only once it is needed. Set by ReplicaBuckets from
  // GradientOptions::reduce_in_place.
  bool reduce_staged_in_place = false;
};

class BucketStorage : public BucketBuffers {
 public:
  BucketStorage() = default;
  // `params[p]` gives slot p its shape; `plan` its bucket and offset.
  BucketStorage(const BucketPlan& plan, const std::vector<at::Tensor>& params,
                BucketStorageOptions options = {});

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

  // [Note: staged copies] Sets `grad` aside to be copied into slot p by fill() of p's bucket: a
  // bucket's gradients then reach its storage in one _foreach_copy_ (a few kernels) instead of
  // one copy kernel each (149 more nodes in gpt2-small's captured graph at world 2). `grad` is
  // held until then, at most a bucket's worth of memory.
  void stage(size_t p, at::Tensor grad);
  // Copies bucket b's staged gradients into their slots and forgets them (allocating the storage
  // first where it is lazy).
  void fill(size_t b) override;
  // Allocates bucket b's storage and slots if they are not yet (lazy under
  // reduce_staged_in_place; a no-op otherwise and for a sparse bucket).
  void materialize(size_t b);
  // Bucket b's staged gradients, when every parameter of b staged one, forgotten here; else empty
  // (nothing changes). See BucketBuffers::take_whole_staged.
  std::vector<at::Tensor> take_whole_staged(size_t b) override;
  // Forgets every staged gradient (an iteration that ended in an error).
  void drop_staged();

  // Moves a gradient parameter p already holds into its slot; with `as_view` the slot becomes
  // p's grad. Used when a plan is built, so nothing accumulated (no_sync steps) is lost.
  void adopt(size_t p, at::Tensor& grad, bool as_view) const;

 private:
  std::vector<at::Tensor> storage_;  // per bucket
  std::vector<at::Tensor> data_;     // per bucket: storage_ without padding
  // Per parameter. Made with set_() rather than view ops so a slot is not an autograd view
  // (Optimizer::zero_grad's detach_ accepts it).
  std::vector<at::Tensor> slots_;
  // Per bucket: the parameters whose gradients stage() set aside, and those gradients, in arrival
  // order; emptied by fill() or take_whole_staged() at the bucket's launch (so empty between
  // iterations) or drop_staged().
  std::vector<std::vector<size_t>> staged_slots_;
  std::vector<std::vector<at::Tensor>> staged_grads_;
  std::vector<size_t> bucket_of_;  // per parameter: its bucket (the plan's bucket_of)
  // What materialize() allocates from: per bucket its plan entry and padded size, per parameter
  // its shape (the plan and the parameters need not outlive the storage).
  std::vector<Bucket> buckets_;
  std::vector<int64_t> padded_;
  std::vector<std::vector<int64_t>> param_sizes_;
  bool in_place_ = false;  // BucketStorageOptions::reduce_staged_in_place
};

}  // namespace ddp::buckets
