#include "common/training_run.hpp"

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <torch/optim/optimizer.h>

#include <iostream>
#include <unordered_set>

#include "ddp/comm/env.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/comm/node_layout.hpp"
#include "ddp/intake/module_intake.hpp"
#include "ddp/io/safetensors.hpp"
#include "ddp/obs/cpu_memory.hpp"
#include "ddp/obs/device_memory.hpp"
#include "ddp/optim/device_step.hpp"
#include "ddp/parallel/grad_clip.hpp"
#include "ddp/parallel/memory_estimate.hpp"
#include "ddp/shard/deferred_init.hpp"

namespace ddp::tools {

namespace {

// --dp-replicate R: the data-parallel ranks (the world; under --tp each tp coordinate's, the
// mesh {dp, tp}'s "dp" group) as an (R, ranks / R) mesh ("replicate", "shard"), rank = replica *
// (ranks / R) + shard, so that a shard group is consecutive ranks (one node's, under a launcher
// that numbers a node's workers together). Under --tp the whole is the 3-D mesh ("replicate",
// "shard", "tp"), tp fastest. Null for one replica (flat). Refused by name where it cannot be.
std::unique_ptr<comm::DeviceMesh> hybrid_mesh(const std::string& tool, const std::string& flag,
                                              const comm::ProcessGroupPtr& world,
                                              const comm::ProcessGroupPtr& dp_group, int64_t tp) {
  // "nodes": collective over the world, whose ranks the launcher numbered node by node.
  const int64_t replicas = flag == "nodes" ? comm::node_count(world) : std::stoll(flag);
  const int64_t size = dp_group->world_size();
  TORCH_CHECK(size % replicas == 0, tool, ": --dp-replicate ", replicas, " does not divide ",
              tp ? "the " + std::to_string(size) + " data-parallel ranks (world / --tp)"
                 : "the world size " + std::to_string(size));
  if (replicas == 1) return nullptr;  // one replica: flat FULLY_SHARD, no cross-replica reduction
  return std::make_unique<comm::DeviceMesh>(dp_group,
                                            std::vector<int64_t>{replicas, size / replicas},
                                            std::vector<std::string>{"replicate", "shard"});
}

// One GPU per worker, chosen by the launcher's LOCAL_RANK (0 without a launcher).
c10::Device device_of(const TrainingFlags& flags) {
  if (flags.device != "cuda") return c10::Device(c10::kCPU);
  const auto env = comm::process_env();
  const int local_rank =
      comm::launcher_from_env(env) ? comm::world_info_from_env(env).local_rank : 0;
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

// --init-params: every parameter by name, of its shape.
void load_params(const std::string& tool, const std::string& path,
                 const std::vector<std::string>& names, const std::vector<at::Tensor>& params) {
  const auto tensors = io::load_safetensors(path);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = tensors.find(names[i]);
    TORCH_CHECK(it != tensors.end(), tool, ": --init-params file '", path,
                "' has no tensor for parameter '", names[i], "'");
    TORCH_CHECK(it->second.sizes() == params[i].sizes(), tool, ": --init-params: parameter '",
                names[i], "' has shape ", params[i].sizes(), " but the file holds ",
                it->second.sizes());
    params[i].copy_(it->second);
  }
}

}  // namespace

TrainingRun::TrainingRun(const TrainingFlags& flags, TrainingRunOptions options)
    : flags_(flags),
      options_(std::move(options)),
      device_(device_of(flags)),
      timeout_(flags.timeout_s) {
  if (!options_.backend.empty()) {
    comm::InitOptions init = init_options(flags, options_.backend);
    init.fake_collectives = options_.fake_collectives;
    world_ = comm::init_process_group(init);
  }
  // On the CPU the device peak counts tensor storages, the model's included: from here on.
  if (options_.count_cpu_memory && !device_.is_cuda()) obs::count_cpu_memory();
  // Deferred initialisation (shard/deferred_init.hpp): under a sharded style the zoo's large
  // models drop what this rank will not hold after each block, so no rank builds the whole model.
  // Not with --tp (it splits whole parameters) or --init-params (it loads whole ones); not under
  // DDP, whose whole model stays on the host until the memory plan below says it fits.
  const shard::DataParallelStyle style =
      shard::parse_style(flags.shard.style.empty() ? "replicate" : flags.shard.style);
  if (options_.wrap && world_ && !flags.shard.dp_replicate.empty() && flags.tp == 0) {
    hybrid_ = hybrid_mesh(options_.tool, flags.shard.dp_replicate, world_, world_, 0);
  }
  // The group the parameters are sharded over: a shard group under --dp-replicate.
  const comm::ProcessGroupPtr& shard_group = hybrid_ ? (*hybrid_)["shard"] : world_;
  std::optional<shard::DeferredInit> deferred;
  if (options_.wrap && world_ && flags.tp == 0 && options_.init_params.empty() &&
      style != shard::DataParallelStyle::kReplicate) {
    shard::DeferredInitOptions init{style, device_};
    if (flags.shard.local_init) {
      init.draws = shard::InitDraws::kLocal;
      init.local_seed = static_cast<uint64_t>(flags.workload.seed);
    }
    deferred.emplace(*shard_group, init);
  }
  TORCH_CHECK(!flags.shard.local_init || deferred, options_.tool,
              ": --local-init initialises shards as the model is built, which --tp and "
              "--init-params do not (they start from whole parameters)");
  workload_ = models::make_workload(flags.model, flags.workload);
  if (options_.wrap && world_ && flags.tp == 0) plan_memory(style);
  if (flags.shard.checkpoint) {
    TORCH_CHECK(workload_.set_checkpointing, "--fsdp-checkpoint: model ", flags.model,
                " has no activation checkpointing");
    workload_.set_checkpointing(true);
  }
  if (!options_.init_params.empty()) {
    const intake::ModuleIntake intake = intake::take_in(*workload_.ptr);
    load_params(options_.tool, options_.init_params, intake.names, intake.params);
  }
  workload_.ptr->to(device_);
  // --tp: the model is split over the mesh's "tp" dim first; data parallelism runs over "dp", and
  // the ranks of one tp group read the same samples (their dp coordinate's).
  TORCH_CHECK(flags.tp == 0 || options_.wrap || world_size() == flags.tp, options_.tool, ": --tp ",
              flags.tp, " at world size ", world_size(), " leaves ",
              world_size() / std::max<int64_t>(flags.tp, 1),
              " data-parallel ranks: add --ddp or a sharded --style");
  split_ = setup_tensor_parallel(options_.tool, flags.tp, world_, workload_, flags.model);
  if (options_.wrap && world_ && !flags.shard.dp_replicate.empty() && flags.tp != 0) {
    hybrid_ =
        hybrid_mesh(options_.tool, flags.shard.dp_replicate, world_, split_.dp_group, flags.tp);
  }
  if (options_.wrap) {
    // One entry point for every style (parallel/data_parallel.hpp) around the same AnyModule.
    DataParallelOptions dp_options;
    dp_options.ddp = flags.ddp;
    // The table once per job: under --tp every dp group has a rank 0 of its own.
    dp_options.ddp.verbose = flags.ddp.verbose && lead();
    dp_options.shard = flags.shard.options;
    dp_options.shard.verbose = dp_options.ddp.verbose;
    if (flags.shard.fsdp_wrap) dp_options.shard.units = workload_.wrap_units;
    if (hybrid_) {
      model_.emplace(workload_.module, *hybrid_, style, std::move(dp_options));
    } else {
      model_.emplace(workload_.module, split_.dp_group, style, std::move(dp_options));
    }
    // One gradient runtime for every style: the hook reduces DDP's buckets and the sharded units;
    // under --dp-replicate the averages across the replicas.
    if (auto hook =
            make_comm_hook(flags.comm_hook, hybrid_ ? (*hybrid_)["replicate"] : split_.dp_group)) {
      model_->register_comm_hook(hook);
    }
  }
  {
    // After the style: a sharded one replaced the parameters by this rank's shards, which are
    // what the optimizer steps.
    const intake::ModuleIntake intake = intake::take_in(*workload_.ptr);
    params_ = intake.params;
    param_names_ = intake.names;
  }
  // Once: neither the style's layouts nor --tp's change after construction, and the clip reads it
  // every step (under --tp a nest over every parameter name).
  sharding_ = make_sharding();
  lr_ = options_.lr;
  schedule_ = schedule_of(flags.recipe, lr_);
  scheduled_ = has_schedule(flags.recipe);
  const auto make = [this](const std::vector<at::Tensor>& params) {
    return make_optimizer(flags_.recipe, params, lr_, options_.sgd_momentum);
  };
  if (flags.optimizer_overlap) {
    // Each parameter's optimizer steps inside backward, once its gradient is reduced; there is
    // then no optimizer step after backward.
    TORCH_CHECK(model_, options_.tool, ": --optimizer-overlap needs --ddp or --fsdp");
    model_->set_optimizer_in_backward([make](const at::Tensor& p) { return make({p}); });
  } else {
    // One optimizer for eager and captured steps (optim/sgd.hpp, optim/adam.hpp): its rate and
    // step count on the device, fused kernels on CUDA.
    optimizer_ = make(params_);
  }
}

void TrainingRun::plan_memory(shard::DataParallelStyle style) {
  parallel::MemoryInputs in;
  const intake::ModuleIntake intake = intake::take_in(*workload_.ptr);
  for (size_t i = 0; i < intake.params.size(); ++i) {
    in.params.emplace_back(intake.names[i], intake.params[i].sizes().vec(),
                           intake.params[i].scalar_type(), intake.aliases[i]);
    in.params.back().trainable = intake.params[i].requires_grad();
  }
  if (flags_.shard.fsdp_wrap) in.units = workload_.wrap_units;
  in.world = hybrid_ ? (*hybrid_)["shard"]->world_size() : world_size();
  in.param_dtype = flags_.shard.options.param_dtype;
  in.reduce_dtype = flags_.shard.options.reduce_dtype;
  in.prefetch = flags_.shard.options.prefetch;
  const std::string& optimizer = flags_.recipe.optimizer;
  in.optimizer_state_per_param_byte =
      optimizer == "adam" || optimizer == "adamw" ? 2.0 : (options_.sgd_momentum != 0 ? 1.0 : 0.0);
  if (workload_.activation_bytes) {
    const int64_t seq = models::workload_seq_len(flags_.model, flags_.workload);
    in.activation_bytes = workload_.activation_bytes(
        flags_.batch_size, seq, flags_.shard.checkpoint, flags_.autocast_bf16 ? 2 : 4);
  }
  memory_estimates_ = parallel::estimate_memory(in);
  if (lead() && flags_.ddp.verbose) {
    for (const auto& e : memory_estimates_) {
      std::cout << options_.tool << ": memory estimate a rank, " << parallel::format_estimate(e)
                << std::endl;
    }
  }
  const int64_t capacity = obs::device_capacity_bytes(device_);
  if (capacity <= 0) return;
  const std::string refusal =
      parallel::memory_refusal(memory_estimates_, style, capacity, world_size());
  TORCH_CHECK(refusal.empty(), options_.tool, ": ", refusal);
}

double TrainingRun::lr_at(int64_t index) const {
  return scheduled_ ? optim::lr_at(schedule_, index) : lr_;
}

void TrainingRun::start_clip(int64_t first_step) {
  // Its norm and skip flag stay on the device; the optimizer drops a non-finite step there.
  clipper_ = make_clipper(flags_.recipe, device_, first_step, optimizer_.get());
}

at::Tensor TrainingRun::forward(const at::Tensor& x) {
  return model_ ? (*model_)(x) : workload_.module.forward(x);
}

std::vector<std::pair<std::string, comm::ProcessGroupPtr>> TrainingRun::groups() const {
  std::vector<std::pair<std::string, comm::ProcessGroupPtr>> out;
  if (world_) out.emplace_back("world", world_);
  if (hybrid_) {
    out.emplace_back("replicate", (*hybrid_)["replicate"]);
    out.emplace_back("shard", (*hybrid_)["shard"]);
  }
  if (split_.mesh) {
    out.emplace_back("dp", (*split_.mesh)["dp"]);
    out.emplace_back("tp", (*split_.mesh)["tp"]);
  }
  return out;
}

comm::Sharding TrainingRun::make_sharding() const {
  const tp::TensorParallel* tensor_parallel = split_.tensor_parallel.get();
  if (!tensor_parallel) return model_ ? model_->sharding() : comm::whole_over(world_);
  // Nested on --tp over the mesh {dp, tp}, whose parent group an export gathers over. The bare
  // model under --tp is tensor parallelism's alone (ddp-bench: the world is the tp group).
  if (!model_) return tensor_parallel->sharding();
  return model_->sharding(*tensor_parallel, split_.mesh->parent());
}

optim::GradShards TrainingRun::grad_shards() {
  return parallel::grad_shards(*workload_.ptr, sharding(), split_.tensor_parallel != nullptr);
}

io::TensorMap TrainingRun::whole_weights() { return io::whole_state(*workload_.ptr, sharding()); }

int64_t TrainingRun::whole_numel() const {
  const layout::TensorLayouts whole = sharding().layouts;
  int64_t numel = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    numel += c10::multiply_integers(whole.of(param_names_[i], params_[i].sizes().vec()).shape);
  }
  return numel;
}

RecipeStep TrainingRun::recipe() {
  RecipeStep step;
  step.wrapped = model();
  step.forward = [this](const at::Tensor& x) { return forward(x); };
  step.loss = [this](const at::Tensor& out, const at::Tensor& y) { return workload_.loss(out, y); };
  step.autocast_bf16 = flags_.autocast_bf16;
  step.device = device_;
  step.clipper = clipper();
  step.grad_shards = [this] { return grad_shards(); };
  step.optimizer = optimizer_.get();
  return step;
}

void TrainingRun::zero_grad() {
  if (model_) {
    model_->zero_grad();  // in place, every style (DDP keeps its bucket views)
  } else if (optimizer_) {
    optimizer_->zero_grad();
  }
}

}  // namespace ddp::tools
