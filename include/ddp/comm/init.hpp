#pragma once
// Process-group creation: rendezvous through a TCPStore at MASTER_ADDR:MASTER_PORT, then a Gloo
// (CPU) or NCCL (CUDA) process group. PyTorch's init_process_group("env://"), natively.

#include <chrono>
#include <optional>
#include <string>

#include "ddp/comm/env.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"

namespace ddp::comm {

// How NCCL makes its communicators: ProcessGroupNCCL::Options and its ncclConfig_t. Ignored by
// Gloo. Each field's default leaves NCCL's own choice; docs/options.md gives what each measured.
struct NcclOptions {
  // Run the collectives on a CUDA stream of the highest priority, so that the block scheduler
  // starts a ready all-reduce's CTAs ahead of queued backward kernels instead of behind them.
  // Default false, as PyTorch (ProcessGroupNCCL::Options::is_high_priority_stream).
  bool high_priority_stream = false;
  // ncclConfig_t::CTAPolicy (NCCL >= 2.27): -1 NCCL's default; 0 default, 1 efficiency (fewer
  // CTAs for the same bandwidth, leaving SMs to overlapped compute), 2 zero-CTA where a
  // copy-engine path exists. Default -1: measured no gain on 2x H200 (issue 36).
  int cta_policy = -1;
  // ncclConfig_t::maxCTAs / minCTAs: -1 NCCL's default. NCCL_MAX_CTAS=4 or 8 made the gpt2-medium
  // DDP step slower on 2x H200 (61.2-61.3 vs 60.1 ms), so none is set.
  int max_ctas = -1;
  int min_ctas = -1;
  // The sharded units' gather buffer (shard/gather_pool.hpp) allocated by NCCL and registered
  // with the communicator as a symmetric window (comm/nccl_window_pool.hpp), each unit's shard
  // copied into its slot and gathered in place: with cta_policy 2, NCCL >= 2.28 runs those
  // all-gathers on the copy engines, taking no SM from the compute they overlap. Default false:
  // measured in docs/benchmarks.md ("The batch-1 regime"); needs torch >= 2.8 and a GPU with CUDA
  // multicast (NVSwitch): refused by name at the group's creation where either is missing.
  bool register_buffers = false;
};

// The collective timeout of a program that names none: DDP_TIMEOUT_S (seconds, > 0; what ddp-run
// --timeout-s sets for its workers), else 5 minutes, as PyTorch. A value that is not a positive
// number is refused naming the variable and the value.
std::chrono::milliseconds default_collective_timeout();

struct InitOptions {
  // "gloo" (CPU tensors) or "nccl" (CUDA tensors; only in a CUDA build), parsed by
  // parse_backend (backend.hpp); text, so that a tool's --backend flag passes straight through.
  // Default gloo: it works everywhere, and CI has no GPU.
  std::string backend = backend_name(Backend::kGloo);
  // One bound for every collective and for the rendezvous. Default default_collective_timeout():
  // DDP_TIMEOUT_S from the launcher, else 5 minutes, as PyTorch: long enough for a slow first
  // step, short enough that a dead rank ends the job instead of hanging it.
  std::chrono::milliseconds timeout = default_collective_timeout();
  // Bound for the rendezvous alone (every rank reaching the store); unset: `timeout`. Workers of
  // one job may start seconds apart (a loaded machine, a slow node), while a short collective
  // timeout is what detects a dead rank quickly: the two are separate knobs, as in torchrun.
  std::optional<std::chrono::milliseconds> rendezvous_timeout;
  // Where the worker is; default: read from the environment (RANK, WORLD_SIZE, ...).
  std::optional<WorldInfo> world;
  // NCCL only: this rank's GPU. Unset: LOCAL_RANK, torchrun's convention (one GPU per local
  // worker). init makes it the calling thread's current device, as PyTorch users do with
  // torch.cuda.set_device(local_rank), so the communicator, the group's control scalars and
  // tensors made on plain "cuda" all use the same GPU.
  std::optional<int> device_index;
  // ProcessGroup::Config::watch_collectives: unset, on for NCCL (a collective that never ends
  // ends the process, named, at `timeout`) and off for Gloo (its waits throw).
  std::optional<bool> watch_collectives;
  // NCCL's communicator options; every sub-group (new_group, DeviceMesh) gets the same.
  NcclOptions nccl;
  // The process's flight recorder (flight_recorder.hpp), applied before the group is made. Unset:
  // the environment's (DDP_FLIGHT_RECORDER_DIR, DDP_FLIGHT_RECORDER_SIZE); a dir from either
  // installs the dump-on-signal handlers.
  std::optional<FlightRecorderOptions> flight_recorder;
  // ProcessGroup::Config::check_collectives: every collective's fingerprint compared across ranks
  // before it is issued. Unset: DDP_CHECK_COLLECTIVES=1 turns it on; off otherwise (it costs a
  // store round trip per collective).
  std::optional<bool> check_collectives;
  // Every collective of the group (and its sub-groups) a no-op that completes at once
  // (comm/fake_backend.hpp, PyTorch's FakeProcessGroup): a step's compute alone at this world
  // size, its shards and memory, for a benchmark's compute-only floor (ddp-bench --no-comm). The
  // results are wrong at world > 1. The group keeps `backend`'s traits and device. Default false.
  bool fake_collectives = false;
};

// Creates the world process group (store prefix "ddp/world"): the rendezvous of rendezvous.hpp,
// then the backend (NCCL: pinned to its GPU, see InitOptions::device_index). Fails with a message
// naming the variable, backend, GPU or peer at fault.
ProcessGroupPtr init_process_group(const InitOptions& options = {});

}  // namespace ddp::comm
