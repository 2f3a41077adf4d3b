// ddp-train: a short data-parallel training run of a model from the zoo on a learnable synthetic
// task, or with --data on the bytes of a text file (text_training.hpp). `ddp-train` alone spawns 2
// local workers; `--nproc N` spawns N; under an external launcher (torchrun --no-python, ddp-run,
// mpirun) it runs as one worker.

#include <ATen/Parallel.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>

#include "checkpoint_saver.hpp"
#include "common/captured_recipe.hpp"
#include "common/ddp_flags.hpp"
#include "common/flag_parse.hpp"
#include "common/init_report.hpp"
#include "common/json_stdout.hpp"
#include "common/recipe_flags.hpp"
#include "common/recipe_step.hpp"
#include "common/run_flags.hpp"
#include "common/tool_error.hpp"
#include "common/training_run.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/files/posix_file.hpp"
#include "ddp/graphs/captured_step.hpp"
#include "ddp/graphs/step_rng.hpp"
#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/io/torch_save.hpp"
#include "ddp/launch/spawn.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/obs/device_memory.hpp"
#include "ddp/optim/param_groups.hpp"
#include "loss_plot.hpp"
#include "progress.hpp"
#include "step_log.hpp"
#include "text_training.hpp"

namespace {

// The shared run flags (tools/common/training_run.hpp): --model net, --nproc (2 without a
// launcher), --lr 0 (the workload's own), the style, --tp, the recipe (--optimizer sgd: momentum
// 0.9 at --lr; adam: --lr / 10; adamw: --lr, default the model's rate / 10), ...
struct Args : ddp::tools::TrainingFlags {
  int steps = 200;
  double peak_tflops = 0;      // --peak-tflops: per device, for MFU; 0: the GPU table's
  bool json = false;           // --json: progress as JSON lines
  std::string backend = "";    // "": gloo on cpu, nccl on cuda
  std::string checkpoint_dir;  // "": no checkpoints
  int checkpoint_every = 0;    // steps between checkpoints; 0: never
  int keep_checkpoints = 3;
  bool checkpoint_async = false;  // --checkpoint-async: written while training goes on
  bool resume = false;
  std::string save_weights;  // "": none; ".pt"/".pth": torch.save format, else safetensors
  int fail_at_step = 0;      // test hook; 0: never
  int fail_rank = 0;
  int unavailable_slot = -1;  // test hook: this LOCAL_RANK fails at start-up on a restart; -1: none
  int max_restarts = 0;       // --max-restarts: the launcher's restarts of every worker
  int min_nproc = 0;          // --min-nproc: the fewest workers to go on with; 0: nproc
  ddp::tools::TextFlags text;  // --data, --eval-every, --sample-bytes (text_training.hpp)
  std::string plot;            // --plot FILE.svg; "": none
};

// Started by a launcher (torchrun, ddp-run, mpirun, srun): then this process is one worker. The
// same variables world_info_from_env reads: under mpirun only OMPI_COMM_WORLD_RANK is set, and a
// check of RANK alone made every mpirun rank spawn a job of its own.
bool under_launcher() { return ddp::comm::launcher_from_env(ddp::comm::process_env()).has_value(); }

// Set by a launcher that restarts failed workers (ddp-run): > 0 on every restart.
int restart_count() {
  const char* value = std::getenv("DDP_RESTART_COUNT");
  return value != nullptr ? std::atoi(value) : 0;
}

// Checkpoint flags that cannot work together, refused before any process starts.
void check_checkpoint_flags(const Args& args) {
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

// Why --cuda-graph cannot run with these flags ("" when it can): beyond the shared refusals
// (run_flags.hpp), what the captured step does not carry yet.
std::string cuda_graph_refusal(const Args& args) {
  if (!args.cuda_graph) return "";
  if (std::string common = ddp::tools::cuda_graph_refusal(args, args.ddp.gradients);
      !common.empty())
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

// The peak learning rate: SGD's the model's own (or --lr); Adam's a tenth of it (as before
// --optimizer adamw existed); AdamW takes --lr as given, else a tenth of the model's SGD rate.
double peak_lr(const Args& args) {
  const double own = args.lr > 0 ? args.lr : ddp::models::workload_lr(args.model, args.workload);
  const std::string& kind = args.recipe.optimizer;
  if (kind == "adam") return own / 10;
  if (kind == "adamw" && args.lr <= 0) return own / 10;
  return own;
}

// The recipe flags against each other and the run's other flags ("" when they fit).
std::string check_recipe(const CLI::App& app, const Args& args) {
  return ddp::tools::check_recipe_flags(app, args.recipe, peak_lr(args), args.optimizer_overlap);
}

// --data: the batches come from the text, through a sampler per data rank; null without it.
std::unique_ptr<ddp::tools::TextTraining> make_text(const Args& args,
                                                    ddp::tools::TrainingRun& run) {
  if (!args.text.data) return nullptr;
  auto text = std::make_unique<ddp::tools::TextTraining>(
      args.text, run.workload(), run.dp_group(), run.data_rank(), args.batch_size,
      args.workload.seed, run.device(), run.lead());
  if (args.cuda_graph) {
    text->drop_partial_batches("a captured step replays one batch shape; PyTorch's drop_last");
  } else if (args.text.drop_last) {
    text->drop_partial_batches("--drop-last, PyTorch's drop_last");
  }
  return text;
}

// The first line: the model's whole parameter count (a tied weight once; a rank holds shards
// under a sharded style and --tp), the style's plan, the world.
void announce(const Args& args, ddp::tools::TrainingRun& run) {
  const auto& tensor_parallel = run.split().tensor_parallel;
  if (tensor_parallel && args.ddp.verbose) std::cout << tensor_parallel->table();
  std::cout << "ddp-train: model " << args.model << ", " << run.whole_numel() << " parameters in "
            << run.wrapped()->plan_summary() << ", world size " << run.world_size() << ", backend "
            << run.world()->backend_name() << ", batch " << args.batch_size << " per worker"
            << std::endl;
}

// --resume (or a launcher's restart): every rank loads the checkpoint rank 0 picked
// (checkpoint_coordinator.hpp) into `state`; returns the first step to run.
int resume_if_asked(const Args& args, ddp::tools::TrainingRun& run,
                    const ddp::io::CoordinatorOptions& ckpt, ddp::io::TrainingState& state,
                    ddp::tools::TextTraining* text) {
  if (args.checkpoint_dir.empty() || !(args.resume || restart_count() > 0)) return 1;
  const auto resumed = ddp::io::resume_latest(*run.world(), ckpt, state);
  if (!resumed) {
    if (run.lead()) {
      std::cout << "ddp-train: no checkpoint in " << args.checkpoint_dir << ", starting fresh"
                << std::endl;
    }
    return 1;
  }
  // The global batch stated in `state` was checked by the load (io::TrainingState).
  if (text) text->seek(state.data_position);
  TORCH_CHECK(text || state.data_position == state.step * state.global_batch, "checkpoint ",
              resumed->dir, " had consumed ", state.data_position, " samples at step ", state.step,
              ", but this run's global batch of ", state.global_batch, " gives ",
              state.step * state.global_batch, ": resume with the --batch-size of the saved run");
  if (run.lead()) {
    std::cout << "ddp-train: resumed from " << resumed->dir << " at step " << state.step
              << std::endl;
  }
  return static_cast<int>(state.step) + 1;
}

// This rank's micro-batches of step `step` on the host: the synthetic samples
// [offset + k * batch, offset + (k + 1) * batch), or the sampler's next windows. Step `step`
// trains on samples [(step - 1) * global_batch, step * global_batch): a pure function of the step
// and the rank, so a resumed run sees the batches an uninterrupted one does.
std::vector<ddp::tools::MicroBatch> host_batch(const Args& args, ddp::tools::TrainingRun& run,
                                               ddp::tools::TextTraining* text, int step,
                                               int64_t global_batch) {
  const int micro = args.recipe.grad_accum;
  const int64_t offset = (step - 1) * global_batch + run.data_rank() * args.batch_size * micro;
  std::vector<ddp::tools::MicroBatch> out;
  for (int k = 0; k < micro; ++k) {
    auto [x, y] = text ? text->next_batch()
                       : run.workload().batch(offset + k * args.batch_size, args.batch_size);
    out.push_back({x, y});
  }
  return out;
}

// One eager step. A batch goes to the device; on CUDA through pinned memory without waiting (a
// copy from pageable memory makes the host wait for the stream, so it could not run ahead).
torch::Tensor eager_step(ddp::tools::TrainingRun& run, const ddp::tools::RecipeStep& recipe,
                         const std::vector<ddp::tools::MicroBatch>& batch) {
  const torch::Device device = run.device();
  const auto to_device = [&](const torch::Tensor& t) {
    return device.is_cuda() ? t.pin_memory().to(device, /*non_blocking=*/true) : t.to(device);
  };
  run.zero_grad();
  std::vector<ddp::tools::MicroBatch> inputs;
  for (const auto& micro : batch) inputs.push_back({to_device(micro.x), to_device(micro.y)});
  return ddp::tools::run_recipe_step(recipe, inputs);
}

// One captured step (--cuda-graph): captured over static inputs of the first batch's shape, then
// each step's micro-batches copied from pinned host memory without a host wait.
torch::Tensor captured_step(ddp::tools::TrainingRun& run,
                            std::optional<ddp::tools::CapturedRecipe>& captured,
                            const std::vector<ddp::tools::MicroBatch>& batch) {
  std::vector<torch::Tensor> pinned;
  for (const auto& micro : batch) {
    pinned.push_back(micro.x.pin_memory());
    pinned.push_back(micro.y.pin_memory());
  }
  if (!captured) {
    const auto on_device = torch::TensorOptions().device(run.device());
    std::vector<ddp::tools::MicroBatch> inputs;
    for (const auto& micro : batch) {
      inputs.push_back(
          {torch::empty_like(micro.x, on_device), torch::empty_like(micro.y, on_device)});
    }
    captured.emplace(run, std::move(inputs), ddp::tools::CapturedRecipe::Inputs::kRefilled);
  }
  captured->step().run(pinned);
  return captured->loss();
}

// --fail-at-step: a crash, not a shutdown (no destructors, no barrier); the other ranks fail on
// their collective timeout or are stopped by the launcher.
void fail_if_asked(const Args& args, int step, int rank) {
  if (step != args.fail_at_step || rank != args.fail_rank || restart_count() != 0) return;
  std::cout.flush();
  std::cerr << "ddp-train: --fail-at-step " << step << ": rank " << rank
            << " exits with code 3 (test hook)" << std::endl;
  std::_Exit(3);
}

// Rank 0's last lines: the stats, the captured graph, the summary, skipped steps, the sample, the
// plot and the weights.
void report_end(const Args& args, ddp::tools::TrainingRun& run, const ddp::tools::StepLog& log,
                const ddp::tools::TextTraining* text, const std::string& sample,
                const std::optional<ddp::tools::CapturedRecipe>& captured,
                const ddp::io::TensorMap& weights) {
  if (args.ddp.verbose) std::cout << ddp::obs::format_summary(run.wrapped()->logging_data());
  if (captured) {
    std::cout << "ddp-train: cuda graph " << ddp::graphs::describe(captured->step()) << std::endl;
  }
  std::cout << "ddp-train: " << log.summary(text != nullptr) << std::endl;
  if (run.clipper() && run.clipper()->skipped_steps() > 0) {
    std::cout << "ddp-train: " << run.clipper()->skipped_steps()
              << " steps skipped: their gradient norm was not finite" << std::endl;
  }
  if (!sample.empty()) std::cout << sample << std::endl;
  if (!args.plot.empty() && !log.curve().train.empty()) {
    auto options =
        text ? text->plot_options(args.model, run.world_size()) : ddp::tools::LossPlotOptions{};
    // The run the curve belongs to: the style (and --tp) and the recipe's optimizer.
    options.title += " (" + args.shard.style +
                     (args.tp > 0 ? " x tp " + std::to_string(args.tp) : std::string()) + ", " +
                     args.recipe.optimizer + ")";
    const std::string svg = ddp::tools::render_loss_svg(log.curve(), options);
    ddp::files::AtomicFile file(args.plot);
    file.write(svg.data(), svg.size());
    file.commit();
    std::cout << "ddp-train: loss plot written to " << args.plot << std::endl;
  }
  if (!args.save_weights.empty()) {
    ddp::io::save_weights(args.save_weights, weights);
    std::cout << "ddp-train: weights written to " << args.save_weights << std::endl;
  }
}

// A worker's arguments for the world it runs in. Under --min-nproc a restart may run fewer
// workers than the job started with (DDP_STARTED_WORLD_SIZE): each takes a larger share of the
// same global batch, so that the checkpoint's global batch (and the samples of every step) stay.
// Also the --unavailable-slot test hook.
Args fit_to_world(Args args) {
  const char* local = std::getenv("LOCAL_RANK");
  if (args.unavailable_slot >= 0 && restart_count() > 0 && local != nullptr &&
      std::atoi(local) == args.unavailable_slot) {
    std::cerr << "ddp-train: --unavailable-slot " << args.unavailable_slot
              << ": this worker's slot fails at start-up (test hook)" << std::endl;
    std::_Exit(4);
  }
  const char* started = std::getenv("DDP_STARTED_WORLD_SIZE");
  const char* world = std::getenv("WORLD_SIZE");
  if (started == nullptr || world == nullptr) return args;
  const int64_t from = std::atoll(started), to = std::atoll(world);
  if (from <= 0 || to <= 0 || from == to) return args;
  const int64_t global = args.batch_size * from;
  TORCH_CHECK(global % to == 0, "ddp-train: the job started with ", from,
              " workers of --batch-size ", args.batch_size, " (a global batch of ", global,
              "), which ", to,
              " workers cannot share evenly: resume with a --nproc that divides it");
  args.batch_size = global / to;
  if (std::getenv("RANK") != nullptr && std::atoi(std::getenv("RANK")) == 0) {
    std::cout << "ddp-train: " << to << (to == 1 ? " worker" : " workers") << " of the " << from
              << " the job started with: " << args.batch_size
              << " samples per worker keep the global batch of " << global << std::endl;
  }
  return args;
}

int run_worker(const Args& given) {
  const auto start = std::chrono::steady_clock::now();
  const Args args = fit_to_world(given);
  at::set_num_threads(args.threads);
  // --json: stdout carries the JSON lines alone (progress.cpp); every line for people (the
  // header, the summary, checkpoints, the library's tables) goes to stderr instead.
  if (args.json) ddp::tools::reserve_stdout_for_json();
  ddp::tools::TrainingRunOptions options;
  options.tool = "ddp-train";
  options.backend =
      !args.backend.empty() ? args.backend : (args.device == "cuda" ? "nccl" : "gloo");
  options.lr = peak_lr(args);
  options.sgd_momentum = 0.9;
  // The process group, the model, --tp, the style, the comm hook, the optimizer (or, with
  // --optimizer-overlap, each parameter's inside backward): tools/common/training_run.hpp.
  ddp::tools::TrainingRun run(args, options);
  const ddp::tools::InitReport init = ddp::tools::gather_init_report(run.world(), start);
  const ddp::comm::ProcessGroupPtr& pg = run.world();
  std::unique_ptr<ddp::tools::TextTraining> text = make_text(args, run);
  const auto forward = [&run](const torch::Tensor& x) { return run.forward(x); };
  if (run.lead()) announce(args, run);

  const int64_t global_batch =
      args.batch_size * args.recipe.grad_accum * run.dp_group()->world_size();
  // The styles register how they split the parameters (io/checkpoint.hpp): every rank writes its
  // pieces, and a resume onto another mesh or style reshards by layout (the global batch kept).
  ddp::io::TrainingState state;
  state.model = run.workload().ptr.get();
  state.optimizer = run.optimizer();
  state.global_batch = global_batch;
  state.layouts = run.sharding().layouts;
  ddp::io::CoordinatorOptions ckpt;
  ckpt.root = args.checkpoint_dir;
  ckpt.keep = args.keep_checkpoints;
  const int first_step = resume_if_asked(args, run, ckpt, state, text.get());
  ddp::tools::CheckpointSaver saver(*pg, ckpt, args.checkpoint_async, run.lead());
  // --grad-clip: the norm over every rank's shards, each step, on the device.
  run.start_clip(first_step);

  // A terminal: ours, or the launcher's when it started this worker behind a pipe.
  const bool terminal =
      ::isatty(STDOUT_FILENO) || std::getenv("DDP_TRAIN_STDOUT_IS_TERMINAL") != nullptr;
  ddp::tools::Progress progress(args.steps, run.lead() && terminal, 20, args.json);
  if (run.lead() && (args.json || args.ddp.verbose)) {
    // Each rank's time to its wrapped model and its resident peak then (issue 60): --json's first
    // line, --verbose's line.
    nlohmann::json line{{"init_s", init.seconds}, {"init_peak_bytes", init.peak_bytes}};
    std::ostringstream text;
    text << "ddp-train: initialisation, rank by rank:";
    for (size_t r = 0; r < init.seconds.size(); ++r) {
      text << " " << init.seconds[r] << " s / " << init.peak_bytes[r] / (1 << 20) << " MiB";
    }
    progress.note(text.str(), line.dump());
  }
  if (text) {
    progress.set_tokens_per_step(text->tokens_per_step() * args.recipe.grad_accum);
    const double peak = args.peak_tflops > 0
                            ? args.peak_tflops * 1e12
                            : ddp::tools::peak_flops_of(ddp::obs::device_name(run.device()));
    progress.set_mfu(run.workload().flops_per_token, peak, run.world_size());
  }
  ddp::tools::StepLog log(pg, run.device(), progress, run.lead(), first_step, args.steps);
  // The step itself (tools/common/recipe_step.hpp): the same body eager and captured.
  const ddp::tools::RecipeStep recipe = run.recipe();
  // --cuda-graph: made at the first step (the batch's shape), destroyed before the run.
  std::optional<ddp::tools::CapturedRecipe> captured;
  // --dropout's masks as a function of (seed, step) (graphs/step_rng.hpp): eager and captured
  // steps draw alike, and a resumed run draws what the uninterrupted one drew.
  ddp::graphs::StepRng step_rng(run.device(), args.workload.seed);
  for (int step = first_step; step <= args.steps; ++step) {
    ddp::comm::note_step(step);  // the flight recorder's entries say which step they were
    saver.poll();                // a background save that landed, or failed, is said here
    fail_if_asked(args, step, pg->rank());
    const auto batch = host_batch(args, run, text.get(), step, global_batch);
    step_rng.begin_step(step);
    const double lr = run.lr_at(step - 1);
    if (run.scheduled()) ddp::optim::set_lr(*run.optimizer(), lr);  // a device write, no graph
    const torch::Tensor loss =
        args.cuda_graph ? captured_step(run, captured, batch) : eager_step(run, recipe, batch);
    log.record(step, loss, run.scheduled() ? std::optional<double>(lr) : std::nullopt,
               run.clipper());
    // The global mean loss is read in batches, at the latest where a line is printed, an
    // evaluation or a checkpoint needs it, or the run ends (collective: the same steps on every
    // rank).
    const bool checkpoint_due = args.checkpoint_every > 0 && step % args.checkpoint_every == 0;
    log.flush_if_due(step, checkpoint_due || (text && text->evaluates_at(step, args.steps)),
                     run.lr(), run.clipper());
    if (text) {
      const ddp::tools::StepLog::Pause evaluating(log);
      text->after_step(step, args.steps, log.last_loss(), forward, log.curve(), progress);
    }
    if (checkpoint_due) {
      state.step = step;
      state.data_position = text ? text->data_position() : step * global_batch;
      saver.save(state);
    }
  }
  saver.finish();
  // Whole weights to write: the sharded styles and --tp gather them on every rank (collective).
  const ddp::io::TensorMap weights =
      args.save_weights.empty() ? ddp::io::TensorMap{} : run.whole_weights();
  std::string sample;  // every rank samples: the forward is collective under sharding and --tp
  if (text) {
    const ddp::tools::StepLog::Pause sampling(log);
    sample = text->sample_report(forward);
  }
  if (run.lead()) {
    progress.finish();
    report_end(args, run, log, text.get(), sample, captured, weights);
  }
  pg->barrier("final barrier");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{
      "ddp-train: data-parallel training of a zoo model under a style (--style, --tp), on its "
      "synthetic task or on text (--data)"};
  ddp::tools::add_run_flags(app, args, args.ddp.verbose);
  app.add_option("--steps", args.steps, "training steps")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--dim", args.workload.dim, "model width (0: the model's default)")
      ->capture_default_str();
  ddp::tools::add_model_flags(app, args.workload);
  ddp::tools::add_recipe_flags(app, args.recipe, {"sgd", "adam", "adamw"});
  app.add_flag("--autocast-bf16", args.autocast_bf16,
               "forward and loss under bf16 autocast (parameters and gradients stay fp32)");
  app.add_option("--peak-tflops", args.peak_tflops,
                 "peak TFLOP/s of one device, for the MFU column (default: a table of GPUs; "
                 "none on the CPU)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_flag("--json", args.json, "progress as one JSON object per logged step (for plots)");
  app.add_option("--backend", args.backend, "gloo or nccl (default: gloo on cpu, nccl on cuda)")
      ->check(CLI::IsMember({"gloo", "nccl"}));
  ddp::tools::add_ddp_flags(app, args.ddp);
  ddp::tools::add_comm_hook_flag(app, args.comm_hook);
  ddp::tools::add_tp_flag(app, args.tp);
  ddp::tools::add_shard_flags(app, args.shard);
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
  ddp::tools::add_text_flags(app, args.text);
  app.add_option("--plot", args.plot,
                 "write the training (and with --data the validation) loss against steps to "
                 "FILE.svg")
      ->type_name("FILE.svg");
  if (const int code = ddp::tools::parse_flags(app, argc, argv, "ddp-train"); code >= 0)
    return code;
  if (const std::string wrong =
          ddp::tools::check_text_flags(app, args.text, args.model, args.recipe.optimizer);
      !wrong.empty()) {
    std::cerr << "ddp-train: " << wrong << std::endl;
    return 2;
  }
  if (const std::string wrong = ddp::tools::check_model_flags(args.model, args.workload, args.tp);
      !wrong.empty()) {
    std::cerr << "ddp-train: " << wrong << std::endl;
    return 2;
  }
  if (const std::string wrong = check_recipe(app, args); !wrong.empty()) {
    std::cerr << "ddp-train: " << wrong << std::endl;
    return 2;
  }

  std::vector<std::string> ddp_only;
  if (args.comm_hook == "powersgd") ddp_only.push_back("--comm-hook powersgd");
  if (const std::string wrong = ddp::tools::check_shard_flags(args.shard, ddp_only);
      !wrong.empty()) {
    std::cerr << "ddp-train: " << wrong << std::endl;
    return 2;
  }
  if (const std::string wrong = cuda_graph_refusal(args); !wrong.empty()) {
    std::cerr << "ddp-train: " << wrong << std::endl;
    return 2;
  }
  if (const std::string wrong = args.plot.empty() ? "" : ddp::tools::check_plot_path(args.plot);
      !wrong.empty()) {
    std::cerr << "ddp-train: " << wrong << std::endl;
    return 2;
  }
  if (const std::string wrong = ddp::tools::environment_refusal(args, "DDP_TRAIN_WORKER");
      !wrong.empty()) {
    std::cerr << "ddp-train: " << wrong << std::endl;
    return 2;
  }
  try {
    if (args.text.data) ddp::tools::check_text_file(args.text, args.model, args.workload);
    check_checkpoint_flags(args);
    if (std::getenv("DDP_TRAIN_WORKER") != nullptr || (under_launcher() && args.nproc == 0)) {
      return run_worker(args);
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
    spawn.restart_count = restart_count();
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
    return ddp::launch::run_self_as_workers(argc, argv, "DDP_TRAIN_WORKER", spawn);
  } catch (const c10::Error& e) {
    std::cerr << ddp::tools::tool_error("ddp-train", e.what_without_backtrace()) << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << ddp::tools::tool_error("ddp-train", e.what()) << std::endl;
    return 1;
  }
}
