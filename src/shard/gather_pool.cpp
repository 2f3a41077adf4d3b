#include "ddp/shard/gather_pool.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace ddp::shard {

GatherPool::GatherPool(size_t slots) : buffers_(slots), busy_(slots, false) {
  TORCH_CHECK(slots >= 1, "ddp: GatherPool needs at least one slot");
}

at::Tensor GatherPool::take(int64_t numel, const at::TensorOptions& options, Ticket* ticket) {
  const c10::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  // 8-aligned, so that a view in any dtype of up to 8 bytes starts and ends aligned.
  const int64_t nbytes = (numel * static_cast<int64_t>(c10::elementSize(dtype)) + 7) / 8 * 8;
  *ticket = Ticket{};
  const auto free = std::find(busy_.begin(), busy_.end(), false);
  if (free == busy_.end()) return at::empty({numel}, options);
  const size_t s = static_cast<size_t>(free - busy_.begin());
  at::Tensor& buffer = buffers_[s];
  if (!buffer.defined() || buffer.numel() < nbytes || buffer.device() != options.device()) {
    buffer = at::Tensor();  // freed before the larger one is made
    buffer = at::empty({nbytes}, options.dtype(at::kByte));
  }
  busy_[s] = true;
  *ticket = Ticket{static_cast<int>(s), epoch_};
  return buffer.narrow(0, 0, nbytes).view(dtype).narrow(0, 0, numel);
}

void GatherPool::give_back(Ticket* ticket) {
  const Ticket t = *ticket;
  *ticket = Ticket{};
  if (t.slot < 0 || t.epoch != epoch_) return;  // its own tensor, or a slot released since
  TORCH_CHECK(static_cast<size_t>(t.slot) < busy_.size() && busy_[static_cast<size_t>(t.slot)],
              "ddp: GatherPool: slot ", t.slot, " given back but not taken");
  busy_[static_cast<size_t>(t.slot)] = false;
}

void GatherPool::release() {
  for (auto& b : buffers_) b = at::Tensor();
  std::fill(busy_.begin(), busy_.end(), false);
  ++epoch_;
}

int64_t GatherPool::allocated_bytes() const {
  int64_t bytes = 0;
  for (const auto& b : buffers_) {
    if (b.defined()) bytes += b.numel();
  }
  return bytes;
}

}  // namespace ddp::shard
