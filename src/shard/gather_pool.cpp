#include "ddp/shard/gather_pool.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "ddp/comm/process_group.hpp"
#include "ddp/detail/capture_status.hpp"

namespace ddp::shard {

at::Tensor GatherPool::take(int64_t numel, const at::TensorOptions& options,
                            comm::ProcessGroup& group, Ticket* ticket) {
  *ticket = Ticket{};
  if (busy_) return at::empty({numel}, options);
  const c10::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  // 8-aligned, so that a view in any dtype of up to 8 bytes starts and ends aligned.
  const int64_t nbytes = (numel * static_cast<int64_t>(c10::elementSize(dtype)) + 7) / 8 * 8;
  // [Note: a buffer the unit's size] A registered buffer only grows (a new one is a collective
  // registration); another is remade when it is over 1.25x the take.
  const bool oversized = !registered_ && buffer_.defined() && buffer_.numel() > nbytes / 4 * 5;
  if (!buffer_.defined() || buffer_.numel() < nbytes || oversized ||
      buffer_.device() != options.device()) {
    buffer_ = at::Tensor();  // freed before the new one is made
    buffer_ = group.empty_registered(nbytes, options.dtype(at::kByte));
    registered_ = group.registers_buffers() && !detail::is_capturing(options.device());
  }
  busy_ = true;
  *ticket = Ticket{true, epoch_};
  return buffer_.narrow(0, 0, nbytes).view(dtype).narrow(0, 0, numel);
}

void GatherPool::give_back(Ticket* ticket) {
  const Ticket t = *ticket;
  *ticket = Ticket{};
  if (!t.pooled || t.epoch != epoch_) return;  // its own tensor, or a buffer released since
  TORCH_CHECK(busy_, "ddp: GatherPool: the buffer was given back but not taken");
  busy_ = false;
}

void GatherPool::release() {
  if (!registered_) buffer_ = at::Tensor();
  busy_ = false;
  ++epoch_;
}

}  // namespace ddp::shard
