// ddp-train: a short data-parallel training run of a model from the zoo on a learnable synthetic
// task, or with --data on the bytes of a text file (text_training.hpp). `ddp-train` alone spawns 2
// local workers; `--nproc N` spawns N; under an external launcher (torchrun --no-python, ddp-run,
// mpirun) it runs as one worker.

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <unordered_set>

#include "common/ddp_flags.hpp"
#include "common/flag_parse.hpp"
#include "common/recipe_flags.hpp"
#include "common/recipe_step.hpp"
#include "common/run_flags.hpp"
#include "common/tensor_parallel_setup.hpp"
#include "common/tool_error.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/graphs/captured_step.hpp"
#include "ddp/graphs/step_rng.hpp"
#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/io/posix_file.hpp"
#include "ddp/io/torch_save.hpp"
#include "ddp/launch/spawn.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/obs/device_memory.hpp"
#include "ddp/optim/device_step.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/parallel/autocast.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/parallel/grad_clip.hpp"
#include "ddp/unit/module_intake.hpp"
#include "loss_log.hpp"
#include "loss_plot.hpp"
#include "progress.hpp"
#include "text_training.hpp"

namespace {

// The shared run flags (tools/common/run_flags.hpp): --model net, --nproc (2 without a launcher),
// --lr 0 (the workload's own), ...
struct Args : ddp::tools::RunFlags {
  int steps = 200;
  ddp::models::WorkloadOptions workload;  // --dim, --tie-weights
  int64_t tp = 0;                         // --tp N: tensor parallel over N ranks; 0: none
  // --optimizer (sgd: momentum 0.9 at --lr; adam: --lr / 10; adamw: --lr, default the model's
  // rate / 10), its groups, the schedule, --grad-clip, --grad-accum (common/recipe_flags.hpp).
  ddp::tools::RecipeFlags recipe;
  bool autocast_bf16 = false;  // --autocast-bf16: forward and loss under bf16 autocast
  double peak_tflops = 0;      // --peak-tflops: per device, for MFU; 0: the GPU table's
  bool json = false;           // --json: progress as JSON lines
  std::string backend = "";    // "": gloo on cpu, nccl on cuda
  std::string comm_hook = "allreduce";
  ddp::DDPOptions ddp;           // the DDP flags (tools/common) write here; --verbose too
  ddp::tools::ShardFlags shard;  // --style, --fsdp, --fsdp-wrap, ... (tools/common)
  std::string checkpoint_dir;    // "": no checkpoints
  int checkpoint_every = 0;      // steps between checkpoints; 0: never
  int keep_checkpoints = 3;
  bool resume = false;
  std::string save_weights;  // "": none; ".pt"/".pth": torch.save format, else safetensors
  int fail_at_step = 0;      // test hook; 0: never
  int fail_rank = 0;
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
  const bool uses = args.checkpoint_every > 0 || args.resume;
  TORCH_CHECK(!uses || !args.checkpoint_dir.empty(),
              "--checkpoint-every and --resume need --checkpoint-dir DIR");
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
  if (std::string common = ddp::tools::cuda_graph_refusal(args, args.ddp.reducer); !common.empty())
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

int run_worker(const Args& args) {
  at::set_num_threads(args.threads);
  // --json: stdout carries the JSON lines alone (written by C stdio in progress.cpp); every line
  // for people (the header, the summary, checkpoints) goes to stderr instead.
  if (args.json) std::cout.rdbuf(std::cerr.rdbuf());
  const ddp::comm::InitOptions init = ddp::tools::init_options(
      args, !args.backend.empty() ? args.backend : (args.device == "cuda" ? "nccl" : "gloo"));
  auto pg = ddp::comm::init_process_group(init);
  const bool lead = pg->rank() == 0;
  // One GPU per worker, chosen by the launcher's LOCAL_RANK.
  const int local_rank = ddp::comm::world_info_from_env(ddp::comm::process_env()).local_rank;
  const torch::Device device = args.device == "cuda"
                                   ? torch::Device(torch::kCUDA, static_cast<int>(local_rank))
                                   : torch::Device(torch::kCPU);

  auto w = ddp::models::make_workload(args.model, args.workload);
  if (args.shard.checkpoint) {
    TORCH_CHECK(w.set_checkpointing, "--fsdp-checkpoint: model ", args.model,
                " has no activation checkpointing");
    w.set_checkpointing(true);
  }
  w.ptr->to(device);
  // --tp: split over the mesh's "tp" dim first; data parallelism runs over "dp", and the ranks of
  // one tp group train on the same samples (their dp coordinate's).
  const auto split = ddp::tools::setup_tensor_parallel("ddp-train", args.tp, pg, w, args.model);
  const auto& tensor_parallel = split.tensor_parallel;
  const ddp::comm::ProcessGroupPtr& dp_group = split.dp_group;
  const int data_rank = split.data_rank;
  // --data: the batches come from the text, through a sampler per data rank.
  std::unique_ptr<ddp::tools::TextTraining> text;
  if (args.text.data) {
    text = std::make_unique<ddp::tools::TextTraining>(
        args.text, w, dp_group, data_rank, args.batch_size, args.workload.seed, device, lead);
    if (args.cuda_graph) {
      text->drop_partial_batches("a captured step replays one batch shape; PyTorch's drop_last");
    } else if (args.text.drop_last) {
      text->drop_partial_batches("--drop-last, PyTorch's drop_last");
    }
  }
  // One entry point for every style (parallel/data_parallel.hpp): DistributedDataParallel for
  // replicate, the sharded module for the sharded styles, around the same AnyModule; asked only
  // as their common base (wrap/wrapped_model.hpp).
  ddp::DataParallelOptions dp_options;
  dp_options.ddp = args.ddp;
  // The table once per job: under --tp every dp group has a rank 0 of its own.
  dp_options.ddp.verbose = args.ddp.verbose && lead;
  dp_options.shard = args.shard.options;
  dp_options.shard.verbose = dp_options.ddp.verbose;
  if (args.shard.fsdp_wrap) dp_options.shard.units = w.wrap_units;
  ddp::DataParallel<torch::nn::AnyModule> model(
      w.module, dp_group, ddp::shard::parse_style(args.shard.style), std::move(dp_options));
  // One gradient runtime for every style: the hook reduces DDP's buckets and the sharded units.
  if (auto hook = ddp::tools::make_comm_hook(args.comm_hook, dp_group)) {
    model.register_comm_hook(hook);
  }
  const auto forward = [&](const torch::Tensor& x) { return model(x); };
  // The parameters once each (a tied weight has two names): what the optimizer steps.
  const std::vector<torch::Tensor> params = ddp::unit::take_in(*w.ptr).params;
  const double lr = peak_lr(args);
  const ddp::optim::LrScheduleOptions schedule = ddp::tools::schedule_of(args.recipe, lr);
  const bool scheduled = ddp::tools::has_schedule(args.recipe);
  auto make_optimizer = [&](const std::vector<torch::Tensor>& params) {
    return ddp::tools::make_optimizer(args.recipe, params, lr, /*sgd_momentum=*/0.9);
  };
  // With --optimizer-overlap each parameter's optimizer steps inside backward, as soon as its
  // bucket is reduced; there is then no optimizer step after backward. Otherwise one optimizer
  // (optim/sgd.hpp, optim/adam.hpp) serves eager and captured steps: its rate and step count live
  // on the device.
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (args.optimizer_overlap) {
    model.set_optimizer_in_backward([&](const torch::Tensor& p) { return make_optimizer({p}); });
  } else {
    opt = make_optimizer(params);
  }
  if (lead) {
    // The whole model's parameters, by their layouts' whole shapes: a rank holds shards under a
    // sharded style and --tp (it printed the local count under --tp), a tied one counts once.
    const ddp::layout::TensorLayouts whole =
        tensor_parallel ? model.layouts(*tensor_parallel) : model.layouts();
    std::unordered_set<const void*> seen;
    int64_t numel = 0;
    for (const auto& item : w.ptr->named_parameters()) {
      if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
      numel += c10::multiply_integers(whole.of(item.key(), item.value().sizes().vec()).shape);
    }
    if (tensor_parallel && args.ddp.verbose) std::cout << tensor_parallel->table();
    std::cout << "ddp-train: model " << args.model << ", " << numel << " parameters in "
              << model.wrapped().plan_summary() << ", world size " << pg->world_size()
              << ", backend " << pg->backend_name() << ", batch " << args.batch_size
              << " per worker" << std::endl;
  }

  const int64_t global_batch = args.batch_size * args.recipe.grad_accum * dp_group->world_size();
  // Step `step` trains on samples [(step - 1) * global_batch, step * global_batch): a pure
  // function of the step and the rank, so a resumed run sees the batches an uninterrupted one does.
  ddp::io::TrainingState state;
  state.model = w.ptr.get();
  state.optimizer = opt.get();
  state.global_batch = global_batch;
  // The styles register how they split the parameters (io/checkpoint.hpp): every rank writes its
  // pieces, and a resume onto another mesh or style reshards by layout (the global batch kept).
  // --tp nests under the data-parallel style's layouts over the mesh {dp, tp} of the world.
  state.layouts = tensor_parallel ? model.layouts(*tensor_parallel) : model.layouts();
  ddp::io::CoordinatorOptions ckpt;
  ckpt.root = args.checkpoint_dir;
  ckpt.keep = args.keep_checkpoints;
  int first_step = 1;
  if (!args.checkpoint_dir.empty() && (args.resume || restart_count() > 0)) {
    // Every rank loads the checkpoint rank 0 picked (checkpoint_coordinator.hpp).
    if (const auto resumed = ddp::io::resume_latest(*pg, ckpt, state)) {
      // The global batch stated above was checked by the load (io::TrainingState).
      if (text) text->seek(state.data_position);
      TORCH_CHECK(text || state.data_position == state.step * global_batch, "checkpoint ",
                  resumed->dir, " had consumed ", state.data_position, " samples at step ",
                  state.step, ", but this run's global batch of ", global_batch, " gives ",
                  state.step * global_batch, ": resume with the --batch-size of the saved run");
      first_step = int(state.step) + 1;
      if (lead) {
        std::cout << "ddp-train: resumed from " << resumed->dir << " at step " << state.step
                  << std::endl;
      }
    } else if (lead) {
      std::cout << "ddp-train: no checkpoint in " << args.checkpoint_dir << ", starting fresh"
                << std::endl;
    }
  }

  // --cuda-graph: the step over static batch tensors, refilled before each run; made at the
  // first step (the batch's shape), destroyed before the process group (declared after it).
  std::unique_ptr<ddp::graphs::CapturedStep> captured;
  torch::Tensor static_x, static_y, static_loss;
  // A terminal: ours, or the launcher's when it started this worker behind a pipe.
  const bool terminal =
      ::isatty(STDOUT_FILENO) || std::getenv("DDP_TRAIN_STDOUT_IS_TERMINAL") != nullptr;
  ddp::tools::Progress progress(args.steps, lead && terminal, 20, args.json);
  if (text) {
    progress.set_tokens_per_step(text->tokens_per_step() * args.recipe.grad_accum);
    const double peak = args.peak_tflops > 0
                            ? args.peak_tflops * 1e12
                            : ddp::tools::peak_flops_of(ddp::obs::device_name(device));
    progress.set_mfu(w.flops_per_token, peak, pg->world_size());
  }
  // --grad-clip: the norm over every rank's shards (parallel/grad_clip.hpp), each step.
  // Its norm and skip flag stay on the device; the optimizer drops a non-finite step there, and
  // the host reads the norm and the count only where a progress line is printed.
  std::optional<ddp::optim::GradClipper> clipper =
      ddp::tools::make_clipper(args.recipe, device, first_step, opt.get());
  // The step itself (tools/common/recipe_step.hpp): the same body eager and captured.
  ddp::tools::RecipeStep recipe;
  recipe.wrapped = &model;
  recipe.forward = forward;
  recipe.loss = [&](const torch::Tensor& out, const torch::Tensor& y) { return w.loss(out, y); };
  recipe.autocast_bf16 = args.autocast_bf16;
  recipe.device = device;
  recipe.clipper = clipper ? &*clipper : nullptr;
  recipe.grad_shards = [&] { return ddp::parallel::grad_shards(model, tensor_parallel.get()); };
  recipe.optimizer = opt.get();
  // The rate and the gradient norm of the steps whose loss is not printed yet (the loss log reads
  // losses in batches): a progress line shows all three of its step.
  std::map<int64_t, double> lrs;
  std::map<int64_t, torch::Tensor> grad_norms;  // device copies, read where a line is printed
  // A batch to the device. On CUDA through pinned memory without waiting: a copy from pageable
  // memory makes the host wait for the stream, so it could not run ahead of the GPU.
  const auto to_device = [&](const torch::Tensor& t) {
    return device.is_cuda() ? t.pin_memory().to(device, /*non_blocking=*/true) : t.to(device);
  };
  ddp::tools::LossCurve curve;    // for --plot
  constexpr int kLossEvery = 20;  // the progress lines' interval (a log prints every 20 steps)
  ddp::tools::LossLog losses(pg, device, kLossEvery);
  const auto start = std::chrono::steady_clock::now();
  // Seconds spent evaluating (--data's validation passes) and sampling: not training, so the
  // steps/s of the progress lines and the last line leave them out. A captured step made them most
  // of a run's time (its steps are a few ms, a validation pass and a sample are eager forwards).
  double not_training_s = 0;
  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  // Training seconds when the first step's loss was read: that step also pays the process's
  // one-time CUDA and library initialization (0.8 s on an H100, most of a short captured run).
  double first_step_s = -1;
  double first_loss = 0, last_loss = 0;
  // --dropout's masks as a function of (seed, step) (graphs/step_rng.hpp): eager and captured
  // steps draw alike, and a resumed run draws what the uninterrupted one drew.
  ddp::graphs::StepRng step_rng(device, args.workload.seed);
  for (int step = first_step; step <= args.steps; ++step) {
    if (step == args.fail_at_step && pg->rank() == args.fail_rank && restart_count() == 0) {
      // A crash, not a shutdown: no destructors, no barrier; the other ranks fail on their
      // collective timeout or are stopped by the launcher.
      std::cout.flush();
      std::cerr << "ddp-train: --fail-at-step " << step << ": rank " << pg->rank()
                << " exits with code 3 (test hook)" << std::endl;
      std::_Exit(3);
    }
    // This rank's micro-batch `k` of the step: the synthetic samples
    // [offset + k * batch, offset + (k + 1) * batch), or the sampler's next windows.
    const int micro = args.recipe.grad_accum;
    const int64_t offset = (step - 1) * global_batch + data_rank * args.batch_size * micro;
    const auto batch_of = [&](int k) {
      return text ? text->next_batch() : w.batch(offset + k * args.batch_size, args.batch_size);
    };
    step_rng.begin_step(step);
    const double lr_now = scheduled ? ddp::optim::lr_at(schedule, step - 1) : lr;
    torch::Tensor loss;
    if (scheduled) ddp::optim::set_lr(*opt, lr_now);  // a device write, outside any graph
    if (args.cuda_graph) {
      // The step's micro-batches, from pinned host memory into the static inputs without a host
      // wait (CapturedStep::run(batch)).
      std::vector<torch::Tensor> batch;
      for (int k = 0; k < micro; ++k) {
        auto [x_cpu, y_cpu] = batch_of(k);
        batch.push_back(x_cpu.pin_memory());
        batch.push_back(y_cpu.pin_memory());
      }
      if (!captured) {
        std::vector<ddp::tools::MicroBatch> inputs;
        std::vector<torch::Tensor> statics;
        for (size_t i = 0; i < batch.size(); i += 2) {
          inputs.push_back(
              {torch::empty_like(batch[i], torch::TensorOptions().device(device)),
               torch::empty_like(batch[i + 1], torch::TensorOptions().device(device))});
          statics.push_back(inputs.back().x);
          statics.push_back(inputs.back().y);
        }
        static_loss = torch::zeros({}, statics.front().options().dtype(torch::kFloat));
        // A replay is bounded by --timeout-s like an eager collective, and under NCCL a stopped
        // or dead rank ends this one naming it, wherever the host waits (the loss read too).
        ddp::graphs::CapturedStepOptions graph_options;
        graph_options.replay_timeout = std::chrono::seconds(args.timeout_s);
        graph_options.group = pg;
        captured = std::make_unique<ddp::graphs::CapturedStep>(
            [&, inputs] {
              // Dropped: DDP copies the new gradients into its buckets, a sharded unit's reduced
              // shards become them (cheaper than a zero and an add per parameter).
              ddp::optim::zero_grad(*opt, /*set_to_none=*/true);
              static_loss.copy_(ddp::tools::run_recipe_step(recipe, inputs));
            },
            statics, device, graph_options);
      }
      captured->run(batch);
      loss = static_loss;
    } else {
      model.zero_grad();  // in place, every style (DDP keeps its bucket views)
      std::vector<ddp::tools::MicroBatch> inputs;
      for (int k = 0; k < micro; ++k) {
        auto [x_cpu, y_cpu] = batch_of(k);
        inputs.push_back({to_device(x_cpu), to_device(y_cpu)});
      }
      loss = ddp::tools::run_recipe_step(recipe, inputs);
    }
    if (clipper) grad_norms[step] = clipper->norm().clone();  // a device copy, no host read
    if (scheduled) {
      lrs[step] = lr_now;
      curve.lr.push_back({step, lr_now});
    }
    // The global mean loss, for display: kept on the device and read in batches (loss_log.hpp),
    // at the latest where a line is printed, an evaluation or a checkpoint needs it, or the run
    // ends; every rank flushes at the same steps (the read is an all-reduce).
    losses.record(step, loss);
    const bool checkpoint_due = args.checkpoint_every > 0 && step % args.checkpoint_every == 0;
    if (step == first_step || step % kLossEvery == 0 || step == args.steps || checkpoint_due ||
        (text && text->evaluates_at(step, args.steps)) || losses.full()) {
      const double secs = seconds_since(start) - not_training_s;
      // The clip's device counters, read here only: a non-finite step (already dropped on the
      // device) ends the run under the error policy, naming it, or is logged under skip.
      if (clipper) clipper->check();
      for (const auto& [at, value] : losses.flush()) {
        TORCH_CHECK(std::isfinite(value), "the loss became ", value, " at step ", at,
                    " (learning rate ", lr, "); lower --lr");
        last_loss = value;
        if (at == first_step) first_loss = value;
        if (lead) {
          ddp::tools::StepReport report;
          report.step = static_cast<int>(at);
          report.loss = value;
          report.steps_per_second = (step - first_step + 1) / secs;
          if (lrs.count(at) > 0) report.lr = lrs[at];
          if (grad_norms.count(at) > 0) report.grad_norm = grad_norms[at].item<double>();
          progress.update(report);
        }
        lrs.erase(at);
        grad_norms.erase(at);
        curve.train.push_back({at, value});
      }
      // After the flush, which waited for the step's loss: the first step's device work included.
      if (step == first_step) first_step_s = seconds_since(start) - not_training_s;
    }
    if (text) {
      const auto evaluating = std::chrono::steady_clock::now();
      text->after_step(step, args.steps, last_loss, forward, curve, progress);
      not_training_s += seconds_since(evaluating);
    }
    if (checkpoint_due) {
      state.step = step;
      state.data_position = text ? text->data_position() : step * global_batch;
      // Returns on every rank once the checkpoint is complete on disk.
      const std::string dir = ddp::io::save_and_barrier(*pg, ckpt, state);
      if (lead) std::cout << "ddp-train: checkpoint " << dir << " saved" << std::endl;
    }
  }
  // Whole weights to write: the sharded styles gather them on every rank (collective).
  ddp::io::TensorMap weights;
  if (!args.save_weights.empty()) {
    weights = ddp::tools::whole_weights(*w.ptr, &model.wrapped(), split);  // by layouts
  }
  // Every rank samples: the forward is collective under the sharded styles and --tp.
  const auto sampling = std::chrono::steady_clock::now();
  const std::string sample = text ? text->sample_report(forward) : "";
  not_training_s += seconds_since(sampling);
  if (lead) {
    progress.finish();
    if (args.ddp.verbose) std::cout << ddp::obs::format_summary(model.logging_data());
    if (captured) {
      std::cout << "ddp-train: cuda graph " << ddp::graphs::describe(*captured) << std::endl;
    }
    const double secs = seconds_since(start) - not_training_s;
    const int ran = std::max(0, args.steps - first_step + 1);
    std::cout << "ddp-train: loss " << first_loss << " -> " << last_loss << " in " << ran
              << " steps (" << secs << " s, " << ran / secs << " steps/s";
    if (text) std::cout << "; " << not_training_s << " s of evaluation and sampling not counted";
    if (ran > 1 && first_step_s >= 0 && secs > first_step_s) {
      std::cout << "; " << (ran - 1) / (secs - first_step_s) << " steps/s after the first step";
    }
    std::cout << ")" << std::endl;
    if (clipper && clipper->skipped_steps() > 0) {
      std::cout << "ddp-train: " << clipper->skipped_steps()
                << " steps skipped: their gradient norm was not finite" << std::endl;
    }
    if (!sample.empty()) std::cout << sample << std::endl;
    if (!args.plot.empty() && !curve.train.empty()) {
      auto options =
          text ? text->plot_options(args.model, pg->world_size()) : ddp::tools::LossPlotOptions{};
      // The run the curve belongs to: the style (and --tp) and the recipe's optimizer.
      options.title += " (" + args.shard.style +
                       (args.tp > 0 ? " x tp " + std::to_string(args.tp) : std::string()) + ", " +
                       args.recipe.optimizer + ")";
      const std::string svg = ddp::tools::render_loss_svg(curve, options);
      ddp::io::AtomicFile file(args.plot);
      file.write(svg.data(), svg.size());
      file.commit();
      std::cout << "ddp-train: loss plot written to " << args.plot << std::endl;
    }
    if (!args.save_weights.empty()) {
      ddp::io::save_weights(args.save_weights, weights);
      std::cout << "ddp-train: weights written to " << args.save_weights << std::endl;
    }
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
    spawn.name = "ddp-train";
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
