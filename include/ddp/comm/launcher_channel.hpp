#pragma once
// [Note: launcher channel] A worker started by a WorkerGroup (launch/worker_group.hpp) finds in
// DDP_LAUNCHER_FD the write end of a pipe its launcher reads, one line per event:
//   "ready"    once the worker has joined its process group (comm::init), and
//   "step N"   at each training step (comm::note_step).
// From them the launcher tells a worker that failed at start-up (never ready: a slot whose device
// is gone, dropped under --min-nproc) from one that failed while training, and names the step a
// failure came at, which is how it recognises a restart loop (the same failure at the same step
// twice). Writes never block: a full pipe drops the line. Without the variable (another launcher,
// no launcher) both calls do nothing. Torch-free: the worker's side lives here, on the floor of
// init and note_step that call it; compiled into the torch-free ddp_launch, whose WorkerGroup reads
// the other end.

#include <cstdint>

namespace ddp::comm {

// The environment variable that carries the pipe's descriptor.
inline constexpr const char* kLauncherFdVar = "DDP_LAUNCHER_FD";

void tell_launcher_ready();
void tell_launcher_step(int64_t step);

}  // namespace ddp::comm
