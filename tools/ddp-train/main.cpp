// ddp-train: a short data-parallel training run of a model from the zoo on a learnable synthetic
// task, or with --data on the bytes of a text file (text_training.hpp). `ddp-train` alone spawns 2
// local workers; `--nproc N` spawns N; under an external launcher (torchrun --no-python, ddp-run,
// mpirun) it runs as one worker. Its flags: train_args.hpp; a worker: train_worker.hpp.

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
#include <iostream>

#include "common/flag_parse.hpp"
#include "common/tool_error.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/launch/spawn.hpp"
#include "train_args.hpp"
#include "train_worker.hpp"

namespace {

// Started by a launcher (torchrun, ddp-run, mpirun, srun): then this process is one worker. The
// same variables world_info_from_env reads: under mpirun only OMPI_COMM_WORLD_RANK is set, and a
// check of RANK alone made every mpirun rank spawn a job of its own.
bool under_launcher() { return ddp::comm::launcher_from_env(ddp::comm::process_env()).has_value(); }

}  // namespace

int main(int argc, char** argv) {
  ddp::tools::TrainArgs args;
  CLI::App app{
      "ddp-train: data-parallel training of a zoo model under a style (--style, --tp), on its "
      "synthetic task or on text (--data)"};
  ddp::tools::add_train_flags(app, args);
  if (const int code = ddp::tools::parse_flags(app, argc, argv, "ddp-train"); code >= 0)
    return code;
  if (const std::string wrong = ddp::tools::train_flags_refusal(app, args); !wrong.empty()) {
    std::cerr << "ddp-train: " << wrong << std::endl;
    return 2;
  }
  try {
    if (args.text.data) ddp::tools::check_text_file(args.text, args.model, args.workload);
    ddp::tools::check_checkpoint_flags(args);
    if (std::getenv("DDP_TRAIN_WORKER") != nullptr || (under_launcher() && args.nproc == 0)) {
      return ddp::tools::run_worker(args);
    }
    ddp::launch::SpawnOptions spawn;
    spawn.nproc = args.nproc > 0 ? args.nproc : 2;
    if (const std::string wrong = ddp::tools::tp_world_refusal(args.tp, spawn.nproc);
        !wrong.empty()) {
      std::cerr << "ddp-train: " << wrong << std::endl;
      return 2;
    }
    spawn.timeout = std::chrono::hours(24);
    // Under a restarting launcher, our workers are that launcher's restart too.
    spawn.restart_count = ddp::tools::restart_count();
    spawn.max_restarts = args.max_restarts;
    spawn.min_nproc = args.min_nproc;
    if (args.min_nproc > spawn.nproc) {
      std::cerr << "ddp-train: --min-nproc " << args.min_nproc << " is more than --nproc "
                << spawn.nproc << std::endl;
      return 2;
    }
    spawn.name = "ddp-train";
    spawn.flight_recorder_dir = args.flight_recorder;
    // --json: rank 0's stdout is the JSON lines alone (its other lines go to stderr), unprefixed,
    // so that the launcher's stdout parses line by line.
    spawn.prefix_rank0_stdout = !args.json;
    // Our stdout a terminal: rank 0 draws its progress bar there (its own stdout is a pipe).
    if (::isatty(STDOUT_FILENO) && !args.json) {
      spawn.env["DDP_TRAIN_STDOUT_IS_TERMINAL"] = "1";
      spawn.prefix_rank0_stdout = false;
    }
    // On the CPU a worker is a fork of this process rather than an exec of it: the flags are
    // parsed already and libtorch's start-up (~0.7 s of CPU per process) is not paid again. On
    // CUDA it execs (a fork must not inherit a CUDA context; this process holds none, but the
    // exec costs nothing beside a GPU's start).
    if (args.device == "cpu") spawn.fork_main = [&args] { return ddp::tools::run_worker(args); };
    return ddp::launch::run_self_as_workers(argc, argv, "DDP_TRAIN_WORKER", spawn);
  } catch (const c10::Error& e) {
    std::cerr << ddp::tools::tool_error("ddp-train", e.what_without_backtrace()) << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << ddp::tools::tool_error("ddp-train", e.what()) << std::endl;
    return 1;
  }
}
