// ddp-bench: the benchmark harness (the seed's benchmarks/dynamo/distributed.py, natively). A step
// is forward + loss + backward + SGD step, timed per iteration; rank 0 prints the result line and
// "mean latency X ms across N runs". The flags and output are shared with
// bench/reference/torch_ddp.py (docs/bench-protocol.md).

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "bench_args.hpp"
#include "bench_worker.hpp"
#include "common/ddp_flags.hpp"
#include "common/flag_parse.hpp"
#include "common/recipe_flags.hpp"
#include "common/run_flags.hpp"
#include "common/tool_error.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/launch/spawn.hpp"

namespace {

using ddp::tools::bench::Args;

// Why --cuda-graph cannot run with these flags, or "": each refused flag needs something a
// captured step cannot do (a host-side timer per phase, a host copy per step, a step-1 graph).
std::string cuda_graph_refusal(const Args& args) {
  if (!args.cuda_graph) return "";
  if (std::string common = ddp::tools::cuda_graph_refusal(args, args.ddp.gradients);
      !common.empty())
    return common;
  if (args.profile) return "--cuda-graph cannot be combined with --profile (per-phase timers)";
  if (!args.inputs.empty()) return "--cuda-graph cannot be combined with --inputs (parity runs)";
  if (!args.graph_dot.empty()) return "--cuda-graph cannot be combined with --graph-dot";
  if (args.comm_floor > 0) {
    return "--cuda-graph cannot be combined with --comm-floor (it replays an eager step's "
           "collectives)";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{
      "ddp-bench: step time of a zoo model under a data-parallel style (--style, --tp), ours or "
      "alone (forward, loss, backward, the optimizer step of --optimizer)"};
  ddp::tools::add_run_flags(app, args, args.ddp.verbose);
  app.add_flag("--toy-model", args.toy_model, "the seed Net(2000): same as --model toy");
  ddp::tools::add_model_flags(app, args.workload);
  ddp::tools::add_tp_flag(app, args.tp);
  ddp::tools::add_shard_flags(app, args.shard);
  app.add_option("--repeat", args.repeat, "timed steps")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", args.warmup, "untimed steps first")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  ddp::tools::add_ddp_flags(app, args.ddp);
  ddp::tools::add_comm_hook_flag(app, args.comm_hook);
  ddp::tools::add_recipe_flags(app, args.recipe, {"sgd", "adam", "adamw"});
  app.add_flag("--autocast-bf16", args.autocast_bf16,
               "forward and loss under bf16 autocast (parameters and gradients stay fp32)");
  app.add_flag("--json", args.json, "one JSON object per result");
  app.add_flag("--no-comm", args.no_comm,
               "every collective a no-op: the step's compute alone at this world size (its "
               "shards, its memory); the model does not train");
  app.add_option("--comm-floor", args.comm_floor,
                 "after the timed steps, replay the last timed step's collectives N times back to "
                 "back with no compute and report their median (comm_floor in --json)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--init-only", args.init_only,
               "build, shard and wrap the model, print the initialisation's time and resident "
               "peak per rank beside the bound (this rank's parameter bytes plus the largest "
               "unit's, plus 25%), take no step");
  app.add_flag("--profile", args.profile, "write a Chrome trace");
  app.add_option("--kernel-trace", args.kernel_trace,
                 "after the timed steps, trace 3 more with torch's Kineto profiler (every kernel "
                 "on its stream) into this Chrome trace JSON; rank r > 0 writes FILE.rank<r>");
  app.add_option("--trace-file", args.trace_file, "Chrome trace path")->capture_default_str();
  app.add_option("--graph-dot", args.graph_dot, "write the autograd graph as Graphviz DOT");
  app.add_option("--init-params", args.init_params, "load parameters by name (safetensors)");
  app.add_option("--inputs", args.inputs, "parity batches x.<step>.<rank>, y.<step>.<rank>");
  app.add_option("--save-params", args.save_params, "rank 0 saves final parameters (safetensors)");
  if (const int code = ddp::tools::parse_flags(app, argc, argv, "ddp-bench"); code >= 0)
    return code;
  if (args.toy_model) args.model = "toy";
  if (const std::string wrong = ddp::tools::check_model_flags(args.model, args.workload, args.tp);
      !wrong.empty()) {
    std::cerr << "ddp-bench: " << wrong << std::endl;
    return 2;
  }
  {
    const double lr = ddp::tools::bench::peak_lr(args);
    const std::string wrong =
        ddp::tools::check_recipe_flags(app, args.recipe, lr, args.optimizer_overlap);
    if (!wrong.empty()) {
      std::cerr << "ddp-bench: " << wrong << std::endl;
      return 2;
    }
  }

  if (const std::string wrong = cuda_graph_refusal(args); !wrong.empty()) {
    std::cerr << "ddp-bench: " << wrong << std::endl;
    return 2;
  }
  std::vector<std::string> ddp_only;
  if (args.comm_hook == "powersgd") ddp_only.push_back("--comm-hook powersgd");
  if (const std::string wrong = ddp::tools::check_shard_flags(args.shard, ddp_only);
      !wrong.empty()) {
    std::cerr << "ddp-bench: " << wrong << std::endl;
    return 2;
  }
  // The floors measure a wrapped model's step: its collectives, or its compute without them.
  if ((args.no_comm || args.comm_floor > 0) && !args.shard.chosen) {
    std::cerr << "ddp-bench: " << (args.no_comm ? "--no-comm" : "--comm-floor")
              << " needs --ddp or a sharded --style (the plain model issues no collectives)"
              << std::endl;
    return 2;
  }
  if (args.no_comm && args.comm_floor > 0) {
    std::cerr << "ddp-bench: --no-comm and --comm-floor measure the two floors in separate runs "
                 "(with --no-comm there are no collectives to replay)"
              << std::endl;
    return 2;
  }
  if (const std::string wrong = ddp::tools::environment_refusal(args, "DDP_BENCH_WORKER");
      !wrong.empty()) {
    std::cerr << "ddp-bench: " << wrong << std::endl;
    return 2;
  }
  try {
    // Under a launcher (torchrun, ddp-run, mpirun, srun: comm/env.hpp) this process is a worker.
    const bool under_launcher = ddp::comm::launcher_from_env(ddp::comm::process_env()).has_value();
    const bool worker =
        std::getenv("DDP_BENCH_WORKER") != nullptr || (under_launcher && args.nproc == 0);
    if (worker || !ddp::tools::bench::distributed(args)) {
      TORCH_CHECK(ddp::tools::bench::distributed(args) || args.nproc <= 1, "ddp-bench: --nproc ",
                  args.nproc,
                  " needs --ddp or a sharded --style (without them the plain model "
                  "runs in one process, the world-1 baseline)");
      return ddp::tools::bench::run_worker(args);
    }
    ddp::launch::SpawnOptions spawn;
    spawn.nproc = args.nproc > 0 ? args.nproc : 1;
    spawn.prefix_rank0_stdout = !args.json;  // --json: rank 0's stdout is JSON lines, unprefixed
    if (const std::string wrong = ddp::tools::tp_world_refusal(args.tp, spawn.nproc);
        !wrong.empty()) {
      std::cerr << "ddp-bench: " << wrong << std::endl;
      return 2;
    }
    if (args.tp > 0 && spawn.nproc != args.tp && !args.shard.chosen) {
      std::cerr << "ddp-bench: --tp " << args.tp << " at world size " << spawn.nproc << " leaves "
                << spawn.nproc / args.tp << " data-parallel ranks: add --ddp or a sharded --style"
                << std::endl;
      return 2;
    }
    spawn.timeout = std::chrono::hours(2);
    spawn.name = "ddp-bench";
    spawn.flight_recorder_dir = args.flight_recorder;
    // Unprefixed: rank 0's result lines are parsed by bench/compare as lines that start with
    // "result " or "{", and only rank 0 prints them.
    spawn.relay_output = false;
    // On the CPU a worker is a fork of this process (ddp-train's reason: tools/ddp-train/main.cpp).
    if (args.device == "cpu") {
      spawn.fork_main = [&args] { return ddp::tools::bench::run_worker(args); };
    }
    return ddp::launch::run_self_as_workers(argc, argv, "DDP_BENCH_WORKER", spawn);
  } catch (const c10::Error& e) {
    std::cerr << ddp::tools::tool_error("ddp-bench", e.what_without_backtrace()) << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << ddp::tools::tool_error("ddp-bench", e.what()) << std::endl;
    return 1;
  }
}
