#pragma once
// Process-group creation: rendezvous through a TCPStore at MASTER_ADDR:MASTER_PORT, then a Gloo
// (CPU) or NCCL (CUDA) process group. PyTorch's init_process_group("env://"), natively.

#include <chrono>
#include <string>

#include "ddp/comm/env.hpp"
#include "ddp/comm/process_group.hpp"

namespace ddp::comm {

struct InitOptions {
  // "gloo" (CPU tensors) or "nccl" (CUDA tensors; only in a CUDA build). Default gloo: it works
  // everywhere, and CI has no GPU.
  std::string backend = "gloo";
  // One bound for every collective and for the rendezvous. Default 5 minutes, as PyTorch: long
  // enough for a slow first step, short enough that a dead rank ends the job instead of hanging it.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Where the worker is; default: read from the environment (RANK, WORLD_SIZE, ...).
  std::optional<WorldInfo> world;
};

// Creates the process group. Fails with a message naming the variable, backend or peer at fault.
ProcessGroupPtr init_process_group(const InitOptions& options = {});

}  // namespace ddp::comm
