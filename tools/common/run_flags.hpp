#pragma once
// The run flags ddp-train and ddp-bench share, registered once here: one name, one check and one
// meaning in both tools. Each tool keeps its own defaults (ddp-bench: the seed's toy model and
// SGD at 0.01, as bench/reference/torch_ddp.py; ddp-train: the seed Net at the model's own rate)
// by setting them in its Args before registering; --help shows them.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "ddp/comm/init.hpp"
#include "ddp/gradients/gradient_options.hpp"

namespace ddp::tools {

struct RunFlags {
  std::string model = "net";   // --model: a zoo workload (models/registry.hpp)
  std::string device = "cpu";  // --device cpu|cuda (cuda: GPU LOCAL_RANK per worker)
  int64_t batch_size = 32;     // --batch-size: samples per rank per micro-batch
  int nproc = 0;               // --nproc N: spawn N local workers; 0: the tool's default
  int threads = 1;             // --threads: intra-op threads per worker (2 cores: 1 each)
  double lr = 0;               // --lr: learning rate; 0: the model's own (Workload::lr)
  int timeout_s = 300;  // --timeout-s: bound of every collective (default: DDP_TIMEOUT_S, else 300)
  bool optimizer_overlap = false;  // --optimizer-overlap: optimizer in backward (every style)
  // --cuda-graph: the whole step captured in a CUDA graph after the warm-up and replayed
  // (graphs/captured_step.hpp) with the capturable optimizers (optim/capturable.hpp).
  bool cuda_graph = false;
  // --flight-recorder DIR: every worker's flight recorder dumps to DIR
  // (comm/recorder/flight_recorder.hpp) when a collective fails or times out, on SIGTERM and
  // SIGUSR1; "" (default): no dumps.
  std::string flight_recorder;
  // --check-collectives: every collective's fingerprint compared across ranks before it is
  // issued (comm/recorder/collective_check.hpp). Default off: a store round trip per collective.
  bool check_collectives = false;
  // --nccl-high-priority-stream / --no-nccl-high-priority-stream, --nccl-cta-policy,
  // --nccl-max-ctas, --nccl-min-ctas, --nccl-register-buffers: how NCCL makes its communicators
  // (comm/init.hpp).
  comm::NcclOptions nccl;
};

// --model, --device, --batch-size, --nproc, --threads, --lr, --timeout-s, --optimizer-overlap,
// --cuda-graph, the --nccl-* flags, and --verbose into `verbose` (the tool's DDPOptions::verbose).
void add_run_flags(CLI::App& app, RunFlags& flags, bool& verbose);

// Why --cuda-graph cannot run with these run flags and DDP flags ("" when it can, or is not set):
// it needs a CUDA device; --optimizer-overlap's torch::optim steps inside backward would bake
// their learning rate into the graph; --find-unused-parameters without --static-graph reads the
// used-parameter map on the host every step. Each tool refuses its own further flags after this.
// The process group's options from these flags: `backend`, --timeout-s, the NCCL options.
comm::InitOptions init_options(const RunFlags& flags, const std::string& backend);

std::string cuda_graph_refusal(const RunFlags& flags, const gradients::GradientOptions& gradients);

// Why --nproc cannot be given here ("" when it can): under a launcher (ddp-run, torchrun, mpirun,
// srun: its rank variables are set) of more than one process that did not start this process as
// the tool's own worker (`worker_env` unset), each of the launcher's processes would start a
// separate world of --nproc workers, silently: refused by name before any worker starts. A
// launcher of one process (a Slurm batch step) leaves the tool free to start its own.
std::string nested_launch_refusal(const RunFlags& flags, const char* worker_env);

// Why --device cannot run here ("" when it can): --device cuda where libtorch sees no CUDA
// device (a CPU build, or no GPU), refused by name before any worker starts.
std::string device_refusal(const RunFlags& flags);

// The first of device_refusal and nested_launch_refusal: what both tools check of the machine
// and the environment before any worker starts ("" when nothing).
std::string environment_refusal(const RunFlags& flags, const char* worker_env);

}  // namespace ddp::tools
