#include "train_worker.hpp"

#include <ATen/Parallel.h>
#include <unistd.h>
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
#include "ddp/models/registry.hpp"
#include "ddp/obs/device_memory.hpp"
#include "ddp/optim/param_groups.hpp"
#include "loss_plot.hpp"
#include "progress.hpp"
#include "step_log.hpp"
#include "text_training.hpp"

namespace ddp::tools {
namespace {

// --data: the batches come from the text, through a sampler per data rank; null without it.
std::unique_ptr<TextTraining> make_text(const TrainArgs& args, TrainingRun& run) {
  if (!args.text.data) return nullptr;
  auto text =
      std::make_unique<TextTraining>(args.text, run.workload(), run.dp_group(), run.data_rank(),
                                     args.batch_size, args.workload.seed, run.device(), run.lead());
  if (args.cuda_graph) {
    text->drop_partial_batches("a captured step replays one batch shape; PyTorch's drop_last");
  } else if (args.text.drop_last) {
    text->drop_partial_batches("--drop-last, PyTorch's drop_last");
  }
  return text;
}

// The first line: the model's whole parameter count (a tied weight once; a rank holds shards
// under a sharded style and --tp), the style's plan, the world.
void announce(const TrainArgs& args, TrainingRun& run) {
  const auto& tensor_parallel = run.split().tensor_parallel;
  if (tensor_parallel && args.ddp.verbose) std::cout << tensor_parallel->table();
  std::cout << "ddp-train: model " << args.model << ", " << run.whole_numel() << " parameters in "
            << run.wrapped()->plan_summary() << ", world size " << run.world_size() << ", backend "
            << run.world()->backend_name() << ", batch " << args.batch_size << " per worker"
            << std::endl;
}

// --resume (or a launcher's restart): every rank loads the checkpoint rank 0 picked
// (checkpoint_coordinator.hpp) into `state`; returns the first step to run.
int resume_if_asked(const TrainArgs& args, TrainingRun& run,
                    const ddp::io::CoordinatorOptions& ckpt, ddp::io::TrainingState& state,
                    TextTraining* text) {
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
std::vector<MicroBatch> host_batch(const TrainArgs& args, TrainingRun& run, TextTraining* text,
                                   int step, int64_t global_batch) {
  const int micro = args.recipe.grad_accum;
  const int64_t offset = (step - 1) * global_batch + run.data_rank() * args.batch_size * micro;
  std::vector<MicroBatch> out;
  for (int k = 0; k < micro; ++k) {
    auto [x, y] = text ? text->next_batch()
                       : run.workload().batch(offset + k * args.batch_size, args.batch_size);
    out.push_back({x, y});
  }
  return out;
}

// One eager step. A batch goes to the device; on CUDA through pinned memory without waiting (a
// copy from pageable memory makes the host wait for the stream, so it could not run ahead).
torch::Tensor eager_step(TrainingRun& run, const RecipeStep& recipe,
                         const std::vector<MicroBatch>& batch) {
  const torch::Device device = run.device();
  const auto to_device = [&](const torch::Tensor& t) {
    return device.is_cuda() ? t.pin_memory().to(device, /*non_blocking=*/true) : t.to(device);
  };
  run.zero_grad();
  std::vector<MicroBatch> inputs;
  for (const auto& micro : batch) inputs.push_back({to_device(micro.x), to_device(micro.y)});
  return run_recipe_step(recipe, inputs);
}

// One captured step (--cuda-graph): captured over static inputs of the first batch's shape, then
// each step's micro-batches copied from pinned host memory without a host wait.
torch::Tensor captured_step(TrainingRun& run, std::optional<CapturedRecipe>& captured,
                            const std::vector<MicroBatch>& batch) {
  std::vector<torch::Tensor> pinned;
  for (const auto& micro : batch) {
    pinned.push_back(micro.x.pin_memory());
    pinned.push_back(micro.y.pin_memory());
  }
  if (!captured) {
    const auto on_device = torch::TensorOptions().device(run.device());
    std::vector<MicroBatch> inputs;
    for (const auto& micro : batch) {
      inputs.push_back(
          {torch::empty_like(micro.x, on_device), torch::empty_like(micro.y, on_device)});
    }
    captured.emplace(run, std::move(inputs), CapturedRecipe::Inputs::kRefilled);
  }
  captured->step().run(pinned);
  return captured->loss();
}

// --fail-at-step: a crash, not a shutdown (no destructors, no barrier); the other ranks fail on
// their collective timeout or are stopped by the launcher.
void fail_if_asked(const TrainArgs& args, int step, int rank) {
  if (step != args.fail_at_step || rank != args.fail_rank || restart_count() != 0) return;
  std::cout.flush();
  std::cerr << "ddp-train: --fail-at-step " << step << ": rank " << rank
            << " exits with code 3 (test hook)" << std::endl;
  std::_Exit(3);
}

// Rank 0's last lines: the stats, the captured graph, the summary, skipped steps, the sample, the
// plot and the weights.
void report_end(const TrainArgs& args, TrainingRun& run, const StepLog& log,
                const TextTraining* text, const std::string& sample,
                const std::optional<CapturedRecipe>& captured, const ddp::io::TensorMap& weights) {
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
    auto options = text ? text->plot_options(args.model, run.world_size()) : LossPlotOptions{};
    // The run the curve belongs to: the style (and --tp) and the recipe's optimizer.
    options.title += " (" + args.shard.style +
                     (args.tp > 0 ? " x tp " + std::to_string(args.tp) : std::string()) + ", " +
                     args.recipe.optimizer + ")";
    const std::string svg = render_loss_svg(log.curve(), options);
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
TrainArgs fit_to_world(TrainArgs args) {
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

}  // namespace

int run_worker(const TrainArgs& given) {
  const auto start = std::chrono::steady_clock::now();
  const TrainArgs args = fit_to_world(given);
  at::set_num_threads(args.threads);
  // --json: stdout carries the JSON lines alone (progress.cpp); every line for people (the
  // header, the summary, checkpoints, the library's tables) goes to stderr instead.
  if (args.json) reserve_stdout_for_json();
  TrainingRunOptions options;
  options.tool = "ddp-train";
  options.backend =
      !args.backend.empty() ? args.backend : (args.device == "cuda" ? "nccl" : "gloo");
  options.lr = peak_lr(args);
  options.sgd_momentum = 0.9;
  // The process group, the model, --tp, the style, the comm hook, the optimizer (or, with
  // --optimizer-overlap, each parameter's inside backward): tools/common/training_run.hpp.
  TrainingRun run(args, options);
  const InitReport init = gather_init_report(run.world(), start);
  const ddp::comm::ProcessGroupPtr& pg = run.world();
  std::unique_ptr<TextTraining> text = make_text(args, run);
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
  state.sharding = run.sharding();
  ddp::io::CoordinatorOptions ckpt;
  ckpt.root = args.checkpoint_dir;
  ckpt.keep = args.keep_checkpoints;
  const int first_step = resume_if_asked(args, run, ckpt, state, text.get());
  CheckpointSaver saver(*pg, ckpt, args.checkpoint_async, run.lead());
  // --grad-clip: the norm over every rank's shards, each step, on the device.
  run.start_clip(first_step);

  // A terminal: ours, or the launcher's when it started this worker behind a pipe.
  const bool terminal =
      ::isatty(STDOUT_FILENO) || std::getenv("DDP_TRAIN_STDOUT_IS_TERMINAL") != nullptr;
  Progress progress(args.steps, run.lead() && terminal, 20, args.json);
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
    const double peak = args.peak_tflops > 0 ? args.peak_tflops * 1e12
                                             : peak_flops_of(ddp::obs::device_name(run.device()));
    progress.set_mfu(run.workload().flops_per_token, peak, run.world_size());
  }
  StepLog log(pg, run.device(), progress, run.lead(), first_step, args.steps);
  // The step itself (tools/common/recipe_step.hpp): the same body eager and captured.
  const RecipeStep recipe = run.recipe();
  // --cuda-graph: made at the first step (the batch's shape), destroyed before the run.
  std::optional<CapturedRecipe> captured;
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
      const StepLog::Pause evaluating(log);
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
    const StepLog::Pause sampling(log);
    sample = text->sample_report(forward);
  }
  if (run.lead()) {
    progress.finish();
    report_end(args, run, log, text.get(), sample, captured, weights);
  }
  pg->barrier("final barrier");
  return 0;
}

}  // namespace ddp::tools
