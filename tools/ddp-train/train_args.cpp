#include "train_args.hpp"

#include <cstdlib>
#include <vector>

#include "common/ddp_flags.hpp"
#include "common/recipe_flags.hpp"
#include "common/run_flags.hpp"
#include "ddp/models/registry.hpp"

namespace ddp::tools {
namespace {

// Why --cuda-graph cannot run with these flags ("" when it can): beyond the shared refusals
// (run_flags.hpp), what the captured step does not carry yet.
std::string captured_refusal(const TrainArgs& args) {
  if (!args.cuda_graph) return "";
  if (std::string common = cuda_graph_refusal(args, args.ddp.gradients); !common.empty())
    return common;
  if (args.tp > 0) {
    return "--cuda-graph cannot be combined with --tp (its collectives inside forward and "
           "backward are not captured yet)";
  }
  if (args.backend == "gloo") {
    return "--cuda-graph needs the nccl backend, not gloo: Gloo's collectives run on the host, "
           "outside any CUDA graph";
  }
  if (args.comm_hook == "powersgd") {
    return "--cuda-graph cannot be combined with --comm-hook powersgd (its steps differ until "
           "its warm-up ends, and a graph replays one)";
  }
  return "";
}

}  // namespace

void add_train_flags(CLI::App& app, TrainArgs& args) {
  add_run_flags(app, args, args.ddp.verbose);
  app.add_option("--steps", args.steps, "training steps")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--dim", args.workload.dim, "model width (0: the model's default)")
      ->capture_default_str();
  add_model_flags(app, args.workload);
  add_recipe_flags(app, args.recipe, {"sgd", "adam", "adamw"});
  app.add_flag("--autocast-bf16", args.autocast_bf16,
               "forward and loss under bf16 autocast (parameters and gradients stay fp32)");
  app.add_option("--peak-tflops", args.peak_tflops,
                 "peak TFLOP/s of one device, for the MFU column (default: a table of GPUs; "
                 "none on the CPU)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_flag("--json", args.json, "progress as one JSON object per logged step (for plots)");
  app.add_option("--backend", args.backend, "gloo or nccl (default: gloo on cpu, nccl on cuda)")
      ->check(CLI::IsMember({"gloo", "nccl"}));
  add_ddp_flags(app, args.ddp);
  add_comm_hook_flag(app, args.comm_hook);
  add_tp_flag(app, args.tp);
  add_shard_flags(app, args.shard);
  app.add_option(
      "--checkpoint-dir", args.checkpoint_dir,
      "directory of step-<N> checkpoints (a sharded style or --tp: every rank writes its "
      "pieces; DDP: rank 0 writes; every rank reads)");
  app.add_option("--checkpoint-every", args.checkpoint_every,
                 "write a checkpoint every N steps (0: never)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--keep-checkpoints", args.keep_checkpoints,
                 "keep the last K checkpoints (0: all)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_flag("--checkpoint-async", args.checkpoint_async,
               "write checkpoints in the background: the step waits only for the copy to host "
               "memory (pinned on a GPU); one save in flight, a failed one said at the next step "
               "and stops the run at the next save");
  app.add_flag("--resume", args.resume,
               "continue from the latest valid checkpoint in --checkpoint-dir, if any (also done "
               "when DDP_RESTART_COUNT > 0)");
  app.add_option("--save-weights", args.save_weights,
                 "write the final weights: PATH.pt/.pth in torch.save format, else safetensors");
  app.add_option("--fail-at-step", args.fail_at_step,
                 "test hook: --fail-rank exits with code 3 at this step unless DDP_RESTART_COUNT "
                 "> 0 (0: never)")
      ->check(CLI::Range(0, 1000000))
      ->group("");  // hidden from --help: the restart tests' hook, not a user's flag
  app.add_option("--fail-rank", args.fail_rank, "the rank --fail-at-step ends")
      ->check(CLI::Range(0, 1 << 20))
      ->group("");
  app.add_option("--unavailable-slot", args.unavailable_slot,
                 "test hook: the worker of this LOCAL_RANK exits with code 4 before joining its "
                 "group when DDP_RESTART_COUNT > 0, as one whose GPU is gone")
      ->check(CLI::Range(0, 1 << 20))
      ->group("");
  app.add_option("--max-restarts", args.max_restarts,
                 "with --nproc: restart every worker when one fails or a collective times out, up "
                 "to N times; they resume from the latest checkpoint in --checkpoint-dir")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--min-nproc", args.min_nproc,
                 "with --nproc and --max-restarts: when a worker fails at start-up (its device "
                 "gone), go on with the others, at least M, keeping the global batch (0: never "
                 "fewer than --nproc)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  add_text_flags(app, args.text);
  app.add_option("--plot", args.plot,
                 "write the training (and with --data the validation) loss against steps to "
                 "FILE.svg")
      ->type_name("FILE.svg");
}

std::string train_flags_refusal(const CLI::App& app, TrainArgs& args) {
  if (std::string wrong = check_text_flags(app, args.text, args.model, args.recipe.optimizer);
      !wrong.empty()) {
    return wrong;
  }
  if (std::string wrong = check_model_flags(args.model, args.workload, args.tp); !wrong.empty()) {
    return wrong;
  }
  if (std::string wrong =
          check_recipe_flags(app, args.recipe, peak_lr(args), args.optimizer_overlap);
      !wrong.empty()) {
    return wrong;
  }
  std::vector<std::string> ddp_only;
  if (args.comm_hook == "powersgd") ddp_only.push_back("--comm-hook powersgd");
  if (std::string wrong = check_shard_flags(args.shard, ddp_only); !wrong.empty()) return wrong;
  if (std::string wrong = captured_refusal(args); !wrong.empty()) return wrong;
  if (!args.plot.empty()) {
    if (std::string wrong = check_plot_path(args.plot); !wrong.empty()) return wrong;
  }
  return environment_refusal(args, "DDP_TRAIN_WORKER");
}

void check_checkpoint_flags(const TrainArgs& args) {
  const bool uses = args.checkpoint_every > 0 || args.resume || args.checkpoint_async;
  TORCH_CHECK(!uses || !args.checkpoint_dir.empty(),
              "--checkpoint-every, --checkpoint-async and --resume need --checkpoint-dir DIR");
  if (args.checkpoint_dir.empty()) return;
  // Resuming must end bit-for-bit where an uninterrupted run ends; state we cannot capture is
  // refused rather than silently lost.
  TORCH_CHECK(!args.optimizer_overlap,
              "--checkpoint-dir cannot be combined with --optimizer-overlap: the per-parameter "
              "optimizers live inside the wrapper and their state is not checkpointed");
  TORCH_CHECK(args.comm_hook != "powersgd",
              "--checkpoint-dir cannot be combined with --comm-hook powersgd: its error-feedback "
              "state is not checkpointed, so a resumed run would differ");
}

double peak_lr(const TrainArgs& args) {
  const double own = args.lr > 0 ? args.lr : models::workload_lr(args.model, args.workload);
  const std::string& kind = args.recipe.optimizer;
  if (kind == "adam") return own / 10;
  if (kind == "adamw" && args.lr <= 0) return own / 10;
  return own;
}

int restart_count() {
  const char* value = std::getenv("DDP_RESTART_COUNT");
  return value != nullptr ? std::atoi(value) : 0;
}

}  // namespace ddp::tools
