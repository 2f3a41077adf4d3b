#include "common/run_flags.hpp"

#include <cstdlib>

#include <torch/cuda.h>

#include "common/flag_parse.hpp"
#include "ddp/comm/env.hpp"

#include "ddp/models/registry.hpp"

namespace ddp::tools {

namespace {
// The NCCL flags, under their own heading in --help, exist only in a build with NCCL.
#if defined(DDP_WITH_NCCL) && DDP_WITH_NCCL
constexpr bool kWithNccl = true;
#else
constexpr bool kWithNccl = false;
#endif
}  // namespace

void add_run_flags(CLI::App& app, RunFlags& flags, bool& verbose) {
  const FlagGroup group(app, "Run");
  app.add_option("--model", flags.model, "model from the zoo")
      ->check(CLI::IsMember(models::workload_names()))
      ->capture_default_str();
  app.add_option("--device", flags.device, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--batch-size", flags.batch_size,
                 "samples per rank per micro-batch (a step reads --batch-size x --grad-accum)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--nproc", flags.nproc, "spawn N local workers")->check(CLI::Range(1, 64));
  app.add_option("--threads", flags.threads, "intra-op threads per worker")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--lr", flags.lr, "learning rate (0: the model's default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  // Default: DDP_TIMEOUT_S (ddp-run --timeout-s), else 300 (comm/init.hpp).
  flags.timeout_s = static_cast<int>((comm::default_collective_timeout().count() + 999) / 1000);
  app.add_option("--timeout-s", flags.timeout_s,
                 "collective timeout in seconds (default: DDP_TIMEOUT_S, else 300)")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app.add_option("--flight-recorder", flags.flight_recorder,
                 "directory for every worker's flight recorder dump (written when a collective "
                 "fails or times out, on SIGTERM and SIGUSR1; read them with ddp-forensics)");
  app.add_flag("--check-collectives", flags.check_collectives,
               "compare every collective's kind, dtype, count and purpose across ranks before it "
               "is issued: a desync is named at the first collective that differs (one store "
               "round trip per collective)");
  app.add_flag("--optimizer-overlap", flags.optimizer_overlap,
               "step each parameter's optimizer once its bucket is reduced (inside backward; a "
               "sharded unit's at the end of backward, on its shard)");
  app.add_flag("--cuda-graph", flags.cuda_graph,
               "capture the whole step (forward, loss, backward, optimizer) in a CUDA graph after "
               "the warm-up and replay it (needs --device cuda)");
  if (kWithNccl) {  // flags only where they apply: a build without NCCL has no use for them
    app.add_flag("--nccl-high-priority-stream,!--no-nccl-high-priority-stream",
                 flags.nccl.high_priority_stream,
                 "NCCL's collectives on a CUDA stream of the highest priority")
        ->capture_default_str()
        ->group("NCCL");
    app.add_option("--nccl-cta-policy", flags.nccl.cta_policy,
                   "ncclConfig_t CTAPolicy: 0 default, 1 efficiency, 2 zero; -1: NCCL's choice")
        ->check(CLI::Range(-1, 2))
        ->capture_default_str()
        ->group("NCCL");
    app.add_flag("--nccl-register-buffers", flags.nccl.register_buffers,
                 "sharded units gather in place into a buffer registered with the communicator "
                 "(with --nccl-cta-policy 2: NCCL's copy-engine all-gathers)")
        ->group("NCCL");
    app.add_option("--nccl-max-ctas", flags.nccl.max_ctas,
                   "ncclConfig_t maxCTAs (1-64); -1: NCCL's choice")
        ->check(CLI::Range(-1, 64))
        ->capture_default_str()
        ->group("NCCL");
    app.add_option("--nccl-min-ctas", flags.nccl.min_ctas,
                   "ncclConfig_t minCTAs (1-64); -1: NCCL's choice")
        ->check(CLI::Range(-1, 64))
        ->capture_default_str()
        ->group("NCCL");
  }
  app.add_flag("--verbose", verbose, "print the bucket or unit table and the runtime stats");
}

comm::InitOptions init_options(const RunFlags& flags, const std::string& backend) {
  comm::InitOptions init;
  init.backend = backend;
  init.timeout = std::chrono::seconds(flags.timeout_s);
  init.nccl = flags.nccl;
  if (flags.check_collectives) init.check_collectives = true;
  if (!flags.flight_recorder.empty()) {
    comm::FlightRecorderOptions recorder;
    recorder.dir = flags.flight_recorder;
    init.flight_recorder = recorder;
  }
  return init;
}

std::string cuda_graph_refusal(const RunFlags& flags, const gradients::GradientOptions& gradients) {
  if (!flags.cuda_graph) return "";
  if (flags.device != "cuda") {
    return "--cuda-graph needs --device cuda, not --device " + flags.device +
           ": CUDA graphs capture GPU work only";
  }
  if (flags.optimizer_overlap) {
    return "--cuda-graph cannot be combined with --optimizer-overlap (torch::optim inside "
           "backward bakes its learning rate into the graph)";
  }
  if (gradients.find_unused_parameters && !gradients.static_graph) {
    return "--cuda-graph cannot be combined with --find-unused-parameters without "
           "--static-graph (the used-parameter map is read on the host every step)";
  }
  return "";
}

std::string nested_launch_refusal(const RunFlags& flags, const char* worker_env) {
  if (flags.nproc == 0 || std::getenv(worker_env) != nullptr) return "";
  const auto launcher = comm::launcher_from_env(comm::process_env());
  if (!launcher) return "";
  // One launched process (a Slurm batch step sets SLURM_PROCID too) may start a world of its own.
  const char* size_var = *launcher == "openmpi" ? "OMPI_COMM_WORLD_SIZE"
                         : *launcher == "slurm" ? "SLURM_NTASKS"
                                                : "WORLD_SIZE";
  const char* size = std::getenv(size_var);
  if (size == nullptr || std::atoi(size) <= 1) return "";
  return "--nproc " + std::to_string(flags.nproc) + " under a launcher (" + *launcher +
         "'s rank variables are set, " + size_var + "=" + size +
         "): the launcher starts the ranks, so each of its processes would start a separate "
         "world of " +
         std::to_string(flags.nproc) + "; drop --nproc";
}

std::string device_refusal(const RunFlags& flags) {
  if (flags.device != "cuda" || torch::cuda::device_count() > 0) return "";
  return "--device cuda: libtorch sees no CUDA device here (a CPU-only build, or no GPU); run "
         "with --device cpu";
}

std::string environment_refusal(const RunFlags& flags, const char* worker_env) {
  if (std::string wrong = device_refusal(flags); !wrong.empty()) return wrong;
  return nested_launch_refusal(flags, worker_env);
}

}  // namespace ddp::tools
