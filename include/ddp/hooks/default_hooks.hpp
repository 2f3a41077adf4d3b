#pragma once
// The built-in hooks of PyTorch's default_hooks.py: allreduce (average), and fp16/bf16 compression;
// and debugging_hooks.py's noop.

#include "ddp/comm/process_group.hpp"
#include "ddp/hooks/comm_hook.hpp"

namespace ddp::hooks {

// Divides by the world size, then sums over ranks: the average, in the gradients' dtype. What the
// gradient runtime does when no hook is registered.
CommHookPtr allreduce_hook(comm::ProcessGroupPtr pg);

// Casts the bucket to fp16 (bf16), all-reduces that, and casts the result back: half the bytes on
// the wire. Divides by the world size before the cast, so the sum of fp16 values stays within range
// (65504) wherever the average does; bf16 has fp32's range and is divided first for the same
// rounding behaviour.
CommHookPtr fp16_compress_hook(comm::ProcessGroupPtr pg);
CommHookPtr bf16_compress_hook(comm::ProcessGroupPtr pg);

// Communicates nothing: each bucket keeps this rank's own gradients (PyTorch's
// debugging_hooks.noop_hook). Wrong for training; it measures what DDP costs without its
// communication (attribution, docs/benchmarks.md).
CommHookPtr noop_hook();

}  // namespace ddp::hooks
