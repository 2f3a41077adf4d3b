#pragma once
// Broadcast of many tensors as few collectives: the start-of-training parameter sync of every
// data-parallel style (DDP's parameters and buffers, the sharded styles' parameters before they
// are split), where one collective per tensor would cost a round trip each.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp::comm {

// Overwrites every tensor of `tensors` with `root`'s values: one flat broadcast per (dtype,
// device), copied back in place. A no-op at world size 1. `what` names the collective in errors.
void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int root,
                         const std::string& what);

}  // namespace ddp::comm
