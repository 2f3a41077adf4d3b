#pragma once
// One training run as ddp-train and ddp-bench both build it, so that each tool's worker is a short
// program about what it does with the run (train and log, or time and report): the process group,
// the device, the zoo model, --tp's split, the data-parallel style around it, the comm hook, the
// optimizer (or the optimizer in backward), the schedule, the clip, and the recipe step over them.
//
//   TrainingRun run(args, options);           // collective when there is a process group
//   run.start_clip(first_step);               // after a resume: its steps numbered from there
//   const RecipeStep step = run.recipe();     // eager, or captured (captured_recipe.hpp)
//   run.zero_grad(); run_recipe_step(step, micro_batches);
//
// A tool never asks which style it runs: the run answers through the style's base
// (wrap::WrappedModel) and the layouts.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/ddp_flags.hpp"
#include "common/recipe_flags.hpp"
#include "common/recipe_step.hpp"
#include "common/run_flags.hpp"
#include "common/tensor_parallel_setup.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/parallel/memory_estimate.hpp"

namespace torch::optim {
class Optimizer;
}

namespace ddp::tools {

// The flags both tools read to build a run (each tool registers them and keeps its defaults).
struct TrainingFlags : RunFlags {
  models::WorkloadOptions workload;  // --dim, --tie-weights, the GPT's shape (tools/common)
  int64_t tp = 0;                    // --tp N: tensor parallel over N ranks; 0: none
  // --optimizer, its groups, the schedule, --grad-clip, --grad-accum (recipe_flags.hpp).
  RecipeFlags recipe;
  bool autocast_bf16 = false;           // --autocast-bf16: forward and loss under bf16 autocast
  std::string comm_hook = "allreduce";  // --comm-hook (ddp_flags.hpp)
  parallel::DDPOptions ddp;             // the DDP flags (ddp_flags.hpp) write here; --verbose too
  ShardFlags shard;                     // --style, --ddp, --fsdp, --fsdp-wrap, ... (ddp_flags.hpp)
};

// What differs between the tools' runs; each field's default is ddp-train's.
struct TrainingRunOptions {
  // Prefixes the run's errors ("ddp-train: ..."), as the tool's other messages.
  std::string tool = "ddp-train";
  // The process group's backend: gloo or nccl. "": no process group (ddp-bench's bare model, one
  // process, the world-1 baseline).
  std::string backend = "gloo";
  // false: the bare model, no style around it (ddp-bench without --ddp, --fsdp or --style).
  bool wrap = true;
  // The peak learning rate (each tool's peak_lr: its own rule for the model's rate and --lr).
  double lr = 0.05;
  // SGD's momentum: 0.9 in ddp-train (it trains to a low loss); 0 in ddp-bench, as
  // bench/reference/torch_ddp.py, so that the two sides step alike.
  double sgd_momentum = 0.9;
  // ddp-bench --init-params: a safetensors file loaded by parameter name before the model moves
  // to the device (parity runs start both sides from the same weights); "": none.
  std::string init_params;
  // ddp-bench on the CPU: count tensor storages from before the model is made, so the device
  // peak it reports includes the model (obs/cpu_memory.hpp). Off: no counting cost.
  bool count_cpu_memory = false;
  // ddp-bench --no-comm: the group's collectives are no-ops (comm::InitOptions::fake_collectives).
  bool fake_collectives = false;
};

class TrainingRun {
 public:
  TrainingRun(const TrainingFlags& flags, TrainingRunOptions options);
  // The recipe step and forward hold pointers into the run: it stays where it was made.
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  // The world's group (null: no process group), this rank, the world size, rank 0.
  const comm::ProcessGroupPtr& world() const { return world_; }
  int rank() const { return world_ ? world_->rank() : 0; }
  int world_size() const { return world_ ? world_->world_size() : 1; }
  // Every process group of the run by its name: "world", then --dp-replicate's "replicate" and
  // "shard", or --tp's "dp" and "tp" (each counts its own collectives: bytes_sent per group).
  std::vector<std::pair<std::string, comm::ProcessGroupPtr>> groups() const;
  bool lead() const { return rank() == 0; }
  // One GPU per worker, the launcher's LOCAL_RANK; or the CPU.
  const c10::Device& device() const { return device_; }
  models::Workload& workload() { return workload_; }
  // The memory plan made before the wrap (parallel/memory_estimate.hpp): replicate, fully_shard,
  // default; empty for the bare model or under --tp.
  const std::vector<parallel::StyleEstimate>& memory_estimates() const { return memory_estimates_; }
  // --tp's mesh and split (none without --tp), the data-parallel group and this rank's samples.
  const TensorParallelSetup& split() const { return split_; }
  const comm::ProcessGroupPtr& dp_group() const { return split_.dp_group; }
  int data_rank() const { return split_.data_rank; }
  // The style around the model (null: the bare model), asked only as every style's base.
  DataParallel<torch::nn::AnyModule>* model() { return model_ ? &*model_ : nullptr; }
  wrap::WrappedModel* wrapped() { return model_ ? &model_->wrapped() : nullptr; }
  // The distinct parameters (a tied weight once), registration order, with their names.
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<std::string>& param_names() const { return param_names_; }
  // The optimizer the step runs after backward; null under --optimizer-overlap (each parameter's
  // steps inside backward).
  torch::optim::Optimizer* optimizer() { return optimizer_.get(); }
  double lr() const { return lr_; }
  // The rate at step `index` (0-based): the schedule's, or the peak rate without one.
  double lr_at(int64_t index) const;
  // Whether the rate changes over the run: then written to the optimizer before each step.
  bool scheduled() const { return scheduled_; }
  // --grad-clip's clipper, made by start_clip (null before it, or without --grad-clip).
  optim::GradClipper* clipper() { return clipper_ ? &*clipper_ : nullptr; }
  void start_clip(int64_t first_step);

  // The model's output for `x`, through the style when there is one.
  at::Tensor forward(const at::Tensor& x);
  // What this rank holds of each parameter and over which groups: the style's sharding, nested on
  // --tp's (comm/sharding/sharding.hpp). What the clip, the export and the checkpoints take.
  const comm::Sharding& sharding() const { return sharding_; }
  // The gradients as this rank holds them, split by the sharding (for the clip's norm).
  optim::GradShards grad_shards();
  // The whole weights on every rank, gathered by their layouts (collective).
  io::TensorMap whole_weights();
  // The whole model's parameter count: by the layouts' whole shapes, a tied weight once.
  int64_t whole_numel() const;
  // The step as the recipe runs it (recipe_step.hpp), over this run's model, clip and optimizer.
  RecipeStep recipe();
  // Zeroes the gradients in place: the style's (DDP keeps its bucket views), or the bare
  // model's through the optimizer.
  void zero_grad();
  // A replay is bounded by --timeout-s like an eager collective (graphs/captured_step.hpp).
  std::chrono::seconds timeout() const { return timeout_; }

 private:
  comm::Sharding make_sharding() const;
  // Estimates every style's bytes a rank from the built (or deferred) model's shapes, prints them
  // with --verbose, and refuses `style` by name before the wrap when it cannot fit the device.
  void plan_memory(shard::DataParallelStyle style);

  const TrainingFlags& flags_;
  TrainingRunOptions options_;
  comm::ProcessGroupPtr world_;
  c10::Device device_;
  models::Workload workload_;
  std::vector<parallel::StyleEstimate> memory_estimates_;
  TensorParallelSetup split_;
  // --dp-replicate R: the world as an (R, world / R) mesh ("replicate", "shard"); null: flat.
  std::unique_ptr<comm::DeviceMesh> hybrid_;
  std::optional<DataParallel<torch::nn::AnyModule>> model_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> param_names_;
  double lr_ = 0;
  optim::LrScheduleOptions schedule_;
  bool scheduled_ = false;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<optim::GradClipper> clipper_;
  comm::Sharding sharding_;  // made once by the constructor (make_sharding)
  std::chrono::seconds timeout_;
};

}  // namespace ddp::tools
