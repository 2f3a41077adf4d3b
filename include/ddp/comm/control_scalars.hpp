#pragma once
// Control scalars: the small integer tensors that steer a job (join's active-rank count, the
// iteration counts, the used-parameter map) rather than carry gradients. A collective needs them
// on its group's device (CPU for Gloo, the current GPU for NCCL) and the host needs them back as
// numbers: these are the one place that does both, so no caller moves tensors by hand.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp::comm {

// A 1-D tensor holding `values`, of `dtype`, on pg.device(): ready for pg's collectives.
at::Tensor control_tensor(const ProcessGroup& pg, const std::vector<int64_t>& values,
                          at::ScalarType dtype = at::kLong);

// Element `index` of `t` (any device, any integer or floating dtype) as a host integer. On a GPU
// this copies to the host and so waits for the device: call it after the collective's wait.
int64_t read_scalar(const at::Tensor& t, int64_t index = 0);

// Every element of `t`, flattened, as host integers (one device-to-host copy).
std::vector<int64_t> read_scalars(const at::Tensor& t);

}  // namespace ddp::comm
