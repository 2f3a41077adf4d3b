#include "ddp/shard/sharded_module.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "ddp/autograd/backward_node.hpp"
#include "ddp/autograd/end_of_backward.hpp"
#include "ddp/gradients/gradient_runtime.hpp"
#include "ddp/gradients/unit_storage.hpp"
#include "ddp/intake/module_intake.hpp"
#include "ddp/obs/log.hpp"
#include "ddp/shard/deferred_init.hpp"
#include "ddp/shard/flat_param_group.hpp"
#include "ddp/shard/unit_schedule.hpp"

namespace ddp::shard {

struct ShardedModule::Observer : gradients::UnitObserver {
  explicit Observer(ShardedModule& module) : module(module) {}
  void backward_started() override { module.start_backward(); }
  void unit_done(size_t group) override { module.unit_done(group); }
  ShardedModule& module;
};

namespace {

// The ("replicate", "shard") dim `dim` of a hybrid mesh; refuses any other mesh by its dims.
comm::ProcessGroupPtr hybrid_dim(const comm::DeviceMesh& mesh, const std::string& dim) {
  const std::vector<std::string>& names = mesh.dim_names();
  std::string dims;
  for (const std::string& n : names) dims += (dims.empty() ? "" : ", ") + ("\"" + n + "\"");
  TORCH_CHECK(names == std::vector<std::string>({"replicate", "shard"}),
              "ddp: hybrid sharding takes a 2-D mesh with dims (\"replicate\", \"shard\"); this "
              "mesh's dims are (",
              dims, ")");
  return mesh.group(dim);
}

}  // namespace

ShardedModule::ShardedModule(std::shared_ptr<torch::nn::Module> module,
                             comm::ProcessGroupPtr process_group, ShardOptions options)
    : ShardedModule(std::move(module), process_group, process_group, nullptr, std::move(options)) {}

ShardedModule::ShardedModule(std::shared_ptr<torch::nn::Module> module,
                             const comm::DeviceMesh& mesh, ShardOptions options)
    : ShardedModule(std::move(module), mesh.parent(), hybrid_dim(mesh, "shard"),
                    hybrid_dim(mesh, "replicate"), std::move(options)) {}

ShardedModule::ShardedModule(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroupPtr world,
                             comm::ProcessGroupPtr shard, comm::ProcessGroupPtr replicate,
                             ShardOptions options)
    : WrappedModel(std::move(module), std::move(world), options.stats_every, "ShardedModule"),
      options_(std::move(options)),
      shard_group_(std::move(shard)),
      replicate_group_(std::move(replicate)) {
  TORCH_CHECK(shard_group_, "ddp: ShardedModule needs a process group");
  // Within the shard group all the sharded runtime; across the world only the start (rank 0's
  // state) and, hybrid, the cross-replica averages.
  const comm::ProcessGroupPtr& pg = shard_group_;
  TORCH_CHECK(options_.style != DataParallelStyle::kReplicate,
              "ddp: style replicate is DistributedDataParallel's; ShardedModule takes "
              "fully_shard or default");
  // Tied weights are registered under several names: the first names the parameter, every name
  // decides its unit (the plan puts it where all its users are). Every rank starts from rank 0's
  // parameters and buffers, before they are split (intake/module_intake.hpp).
  const intake::ModuleIntake intake = intake::take_in(*module_ptr());
  // Deferred initialisation (deferred_init.hpp) kept only this rank's rows of some parameters:
  // they are checked by checksum, not broadcast, and the groups take their rows.
  intake::AbsentValues absent;
  for (size_t i = 0; i < intake.params.size(); ++i) {
    const std::optional<KeptRows> kept = kept_rows(intake.params[i]);
    if (!kept) continue;
    TORCH_CHECK(kept->world == pg->world_size() && kept->rank == pg->rank(), "ddp: parameter '",
                intake.names[i], "' was built under deferred initialisation as rank ", kept->rank,
                " of ", kept->world, ", but this ShardedModule is rank ", pg->rank(), " of ",
                pg->world_size(), "; build it with the process group it is wrapped with");
    absent.emplace(intake.params[i].unsafeGetTensorImpl(), kept->checksum);
  }
  intake::synchronize_replicas(*group(), intake, "ShardedModule", absent);
  params_ = intake.params;
  names_ = intake.names;
  set_buffers(intake.buffers);
  std::vector<ParamShape> shapes;
  for (size_t i = 0; i < params_.size(); ++i) {
    shapes.emplace_back(names_[i], params_[i].sizes().vec(), params_[i].scalar_type(),
                        intake.aliases[i]);
    shapes.back().trainable = params_[i].requires_grad();
  }
  plan_ = plan_shards(shapes, options_.units, pg->world_size(), options_.style);
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(plan_.params[i].sharded() || absent.count(params_[i].unsafeGetTensorImpl()) == 0,
                "ddp: parameter '", names_[i],
                "' was built under deferred initialisation keeping only this rank's rows, but "
                "style ",
                style_name(options_.style), " replicates it (dim 0 of ",
                plan_.shapes[i].shape.empty() ? 1 : plan_.shapes[i].shape[0], " over ",
                pg->world_size(), " ranks); build it under the style it is wrapped with");
  }
  layouts_.mesh = {pg->world_size()};
  layouts_.coordinate = {pg->rank()};
  for (size_t i = 0; i < plan_.shapes.size(); ++i) {
    layouts_.by_name[plan_.shapes[i].name] = plan_.params[i].layout;
    for (const auto& alias : plan_.shapes[i].aliases)
      layouts_.by_name[alias] = plan_.params[i].layout;
  }
  if (replicate_group_) {
    TORCH_CHECK(int64_t(replicate_group_->world_size()) * pg->world_size() == group()->world_size(),
                "ddp: hybrid sharding: ", replicate_group_->world_size(), " replicas of ",
                pg->world_size(), " shards are not the mesh's ", group()->world_size(), " ranks");
    // Nothing split across the replicas: each holds what the shard plan gives its shard rank. A
    // mesh dim in front, no placement on it (layout::nest would put it behind, and wants even
    // inner splits).
    layouts_.mesh.insert(layouts_.mesh.begin(), replicate_group_->world_size());
    layouts_.coordinate.insert(layouts_.coordinate.begin(), replicate_group_->rank());
    for (auto& [name, l] : layouts_.by_name) {
      l.mesh.insert(l.mesh.begin(), replicate_group_->world_size());
      for (layout::Placement& p : l.placements) ++p.mesh_dim;
    }
  }
  schedule_ = std::make_unique<UnitSchedule>(plan_, params_, pg, options_);
  observer_ = std::make_unique<Observer>(*this);
  const auto& groups = schedule_->groups();
  if (options_.param_dtype) {
    TORCH_CHECK(at::isFloatingType(*options_.param_dtype), "ddp: param_dtype ",
                *options_.param_dtype, " is not a floating-point type");
    for (size_t i = 0; i < params_.size(); ++i) {
      TORCH_CHECK(plan_.shapes[i].trainable, "ddp: param_dtype ", *options_.param_dtype,
                  ": parameter '", names_[i],
                  "' is frozen (requires_grad false), so it stays whole and would keep its dtype "
                  "beside cast ones; cast it to ",
                  *options_.param_dtype, " before wrapping");
      TORCH_CHECK(plan_.params[i].sharded(), "ddp: param_dtype ", *options_.param_dtype,
                  " with style default: parameter '", names_[i], "' is replicated (dim 0 of ",
                  plan_.shapes[i].shape.empty() ? 1 : plan_.shapes[i].shape[0],
                  " does not divide by ", pg->world_size(),
                  " ranks) and would keep its dtype beside cast ones; use style fully_shard");
    }
  }
  // FSDP2's default: gradients are reduced in the dtype they were computed in.
  const std::optional<c10::ScalarType> reduce_dtype =
      options_.reduce_dtype ? options_.reduce_dtype : options_.param_dtype;
  if (reduce_dtype) check_reduce_dtype(*reduce_dtype, !options_.reduce_dtype);
  for (auto& group : groups) {
    if (reduce_dtype) group->set_reduce_dtype(*reduce_dtype);
    if (options_.param_dtype) group->set_param_dtype(*options_.param_dtype);
  }
  std::vector<gradients::ReduceUnit> units;
  for (auto& group : groups) {
    gradients::ReduceUnit unit;
    unit.name = group->unit_name();
    unit.index = group->unit();
    unit.params = group->params();
    for (size_t i : group->members()) unit.names.push_back(names_[i]);
    unit.offsets = group->member_offsets();
    unit.row_numel = group->shard_numel();
    unit.options = group->flat_shard().options().dtype(group->reduce_dtype());
    unit.storage = group.get();
    units.push_back(std::move(unit));
  }
  // DEFAULT's replicated parameters: all-reduced in buckets, in the same gradient path.
  gradients::ReplicaParams replicated{{}, {}, options_.replicated, {}};
  for (size_t i = 0; i < params_.size(); ++i) {
    // A frozen parameter gets no gradient: nothing to reduce, no hook (left alone).
    if (plan_.params[i].sharded() || !plan_.shapes[i].trainable) continue;
    replicated.params.push_back(params_[i]);
    replicated.names.push_back(names_[i]);
  }
  if (!units.empty() || !replicated.params.empty()) {
    // DEFAULT's replicated parameters are whole on every rank: averaged over the world.
    set_gradients(std::make_unique<gradients::GradientRuntime>(
        group(), std::move(units), observer_.get(), std::move(replicated),
        gradients::UnitGroups{pg, replicate_group_}));
    schedule_->attach(gradients());
  }
  if (pg->rank() == 0 && (options_.verbose || obs::log_level() >= obs::LogLevel::kInfo)) {
    obs::log(obs::LogLevel::kError, 0, unit_table());
  }
  // Named units become run_unit targets.
  std::unordered_map<std::string, size_t> unit_by_name;
  for (size_t u = 0; u < plan_.units.size(); ++u) {
    if (!plan_.units[u].name.empty()) unit_by_name[plan_.units[u].name] = u;
  }
  for (const auto& item : module_ptr()->named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const auto it = unit_by_name.find(item.key());
    if (it == unit_by_name.end()) continue;
    registrations_.push_back(std::make_unique<unit::UnitRegistration>(
        *item.value(), static_cast<unit::UnitListener&>(*this), it->second));
  }
}

// The gradient runtime's hooks and observer calls use the schedule's groups: it goes first.
ShardedModule::~ShardedModule() { drop_gradients(); }

comm::Sharding ShardedModule::sharding() const {
  if (!replicate_group_) return WrappedModel::sharding();
  return {layouts(), {replicate_group_, shard_group_}, group()};
}

const std::vector<size_t>& ShardedModule::unit_order() const { return schedule_->last_order(); }

int64_t ShardedModule::peak_gathered_bytes() const { return schedule_->peak_gathered_bytes(); }

GatheredBytes ShardedModule::peak_gathered_by_owner() const { return schedule_->peak_by_owner(); }

void ShardedModule::reset_peak_memory() { schedule_->reset_peak(); }

void ShardedModule::warn_units_not_run() const {
  // A named unit the model never ran through run_unit is gathered with the root by pre_forward
  // and stays gathered until the end of backward: correct, but it saves no memory, and nothing
  // else would tell the user that the policy and the model's code disagree.
  for (size_t g = 0; g < schedule_->num_groups(); ++g) {
    const size_t u = schedule_->unit_of_group(g);
    if (plan_.units[u].name.empty() || schedule_->run_by_model(u)) continue;
    obs::log(obs::LogLevel::kWarn, group()->rank(),
             "ddp: warning: unit '" + plan_.units[u].name +
                 "' did not run through ddp::unit::run_unit in the first forward, so it is "
                 "gathered for the whole step (" +
                 std::to_string(schedule_->group(g).full_bytes()) +
                 " bytes per rank) instead of around its own forward and backward; run it as "
                 "ddp::unit::run_unit(*module, fn, input) in the model's forward, or leave it "
                 "out of ShardOptions::units");
  }
}

void ShardedModule::check_reduce_dtype(c10::ScalarType dtype, bool from_param_dtype) {
  TORCH_CHECK(at::isFloatingType(dtype), "ddp: reduce_dtype ", dtype,
              " is not a floating-point type; gradients are averaged");
  // One tiny reduce-scatter in that dtype, on every rank: a backend that cannot reduce it refuses
  // before communicating (Gloo 1.13 with bf16: "Invalid scalar type"), the same on every rank, so
  // the error comes now and names the dtype instead of coming from the first backward.
  const at::Tensor probe =
      at::zeros({shard_group_->world_size()},
                params_.empty() ? at::TensorOptions(dtype) : params_[0].options().dtype(dtype));
  try {
    shard_group_->reduce_scatter(probe, comm::ReduceOp::kAvg, "reduce_dtype probe");
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "ddp: reduce_dtype ", dtype,
                from_param_dtype
                    ? " (param_dtype's, the default; set reduce_dtype to reduce in another)"
                    : "",
                ": the ", shard_group_->backend_name(), " backend cannot reduce it (",
                e.what_without_backtrace(), ")");
  }
}

ShardMemory ShardedModule::memory() const {
  ShardMemory m;
  for (const at::Tensor& p : params_) {
    m.param_bytes += static_cast<int64_t>(p.numel() * p.element_size());
    if (p.grad().defined()) {
      m.grad_bytes += static_cast<int64_t>(p.grad().numel() * p.grad().element_size());
    }
  }
  m.peak_gathered_bytes = schedule_->peak_gathered_bytes();
  m.peak_by_owner = schedule_->peak_by_owner();
  return m;
}

// [Note: a forward whose backward never runs] A forward under grad mode gathers the parameters
// (they take their full shapes) and sets the shards' gradients aside for its backward to add to;
// only that backward, or reshard(), puts them back. Without either (an evaluation forward without
// torch::NoGradGuard) an optimizer step finds full-shaped parameters without gradients and skips
// them, silently, and the next backward adds its gradients to the stale ones set aside. The step
// cannot be seen from here, so the next forward refuses when gradients were left aside (nonzero:
// an evaluation after zero_grad leaves nothing to lose, and neither does one before any
// backward), and reading the parameters in between (a checkpoint's layouts, a norm) refuses
// always: both name reshard() and NoGradGuard. Two forwards then two backwards stay legal.
void ShardedModule::require_between_steps(const char* operation) const {
  TORCH_CHECK(phase_ != Phase::kForward, "ddp: ", operation,
              ": the parameters are gathered by a forward under grad mode whose backward has not "
              "run (an evaluation without torch::NoGradGuard?); call model.reshard() after such a "
              "forward, or run it under torch::NoGradGuard");
}

void ShardedModule::pre_forward() {
  TORCH_CHECK(phase_ != Phase::kBackward,
              "ddp: forward of a sharded module while its backward is running");
  if (phase_ == Phase::kForward) {
    for (size_t g = 0; g < schedule_->num_groups(); ++g) {
      TORCH_CHECK(!schedule_->group(g).holds_gradients_aside(),
                  "ddp: forward: the last forward ran under grad mode and its backward never "
                  "did (an evaluation without torch::NoGradGuard?): it set the last backward's "
                  "gradients aside, so an optimizer step since then skipped them; call "
                  "model.reshard() after such a forward, or run it under torch::NoGradGuard");
    }
  }
  phase_ = Phase::kForward;
  stats().collect(num_synchronized_backwards());
  stats().forward_started();
  // Rank 0's buffers first, as DDP's forward (ShardOptions::broadcast_buffers), an evaluation's
  // under no_grad included.
  if (options_.broadcast_buffers && require_sync()) {
    sync_buffers_for(at::GradMode::is_enabled() ? ForwardKind::kTraining
                                                : ForwardKind::kEvaluation);
  }
  schedule_->begin_forward();
  // The gradient runtime is ready from here, so a backward of the module's own forward is reduced
  // as the wrapper's is.
  if (gradients() && at::GradMode::is_enabled()) {
    // DEFAULT's replicated parameters: their accumulator hooks move to the stream this forward
    // runs on, as DDP's do (gradients/autograd_hooks.hpp, Streams): a step captured on a side
    // stream failed at world 4 with "operation would make the legacy stream depend on a capturing
    // blocking stream" (issue 59's matrix, Styles/CheckpointMatrixGpu.*/default_world4).
    gradients()->follow_current_stream();
    if (require_sync()) {
      // Gradients complete in the reverse of the forward's unit order (the last forward's; the
      // units not run through run_unit, the root among them, go last).
      gradients()->prepare_for_backward({}, schedule_->expected_backward_order());
    } else {
      gradients()->prepare_for_local_backward();
    }
  }
}

void ShardedModule::end_forward(const std::vector<at::Tensor>& /*outputs: nodes go on each*/) {
  if (phase_ == Phase::kForward && schedule_->end_forward()) warn_units_not_run();
  if (!at::GradMode::is_enabled()) {
    reshard();  // an evaluation forward: no backward will come to put the shards back
    return;
  }
  if (gradients() && require_sync()) {
    gradients()->note_forward_end();
    stats().forward_ended();
  }
}

at::Tensor ShardedModule::attach_start_backward(const at::Tensor& output) {
  if (!output.defined() || !at::GradMode::is_enabled()) return output;
  return autograd::on_backward(output, [this] {
    start_backward();
    // The last unit of the forward runs its backward first (a no-op when already gathering).
    schedule_->start_backward();
  });
}

at::Tensor ShardedModule::cast_input(const at::Tensor& input) const {
  if (!options_.param_dtype || !input.defined() || !at::isFloatingType(input.scalar_type()) ||
      input.scalar_type() == *options_.param_dtype) {
    return input;
  }
  return input.to(*options_.param_dtype);
}

at::Tensor ShardedModule::before_unit_forward(size_t unit, const at::Tensor& input) {
  // Between steps the parameters are this rank's shards: a unit run through the module itself
  // would compute on them (a head's logits cut to its rows), so it is refused by name.
  TORCH_CHECK(phase_ != Phase::kIdle || schedule_->group_of_unit(unit) < 0, "ddp: unit '",
              plan_.units[unit].name,
              "' ran outside the wrapper's forward while its parameters are sharded (",
              style_name(options_.style),
              "): run the model through the wrapper (model(x)), or inside model.evaluation() "
              "(every unit gathered, wrap/evaluation.hpp)");
  schedule_->before_unit_forward(unit, phase_ == Phase::kForward);
  return cast_input(input);
}

at::Tensor ShardedModule::after_unit_forward(size_t unit, const at::Tensor& output) {
  // A recompute inside backward (activation checkpointing) keeps the unit: its backward is next.
  if (phase_ != Phase::kForward) return output;
  at::Tensor out = autograd::on_backward(output, [this, unit] { before_unit_backward(unit); });
  schedule_->after_unit_forward(unit, at::GradMode::is_enabled());
  return out;
}

void ShardedModule::before_unit_backward(size_t unit) {
  start_backward();
  schedule_->before_unit_backward(unit);
}

void ShardedModule::start_backward() {
  phase_ = Phase::kBackward;
  if (finish_queued_) return;
  finish_queued_ = true;
  // The gradient runtime's end of backward first (every reduction finished, shards written),
  // then this one's ([Note: one end-of-backward callback]).
  if (gradients()) gradients()->start_backward();
  autograd::at_end_of_backward([this] { finish_backward(); });
}

void ShardedModule::unit_done(size_t g) {
  start_backward();
  schedule_->unit_reduced(g, require_sync());
}

void ShardedModule::finish_backward() {
  finish_queued_ = false;
  phase_ = Phase::kIdle;
  schedule_->note_memory();
  schedule_->end_step();
}

std::vector<std::pair<std::string, std::string>> ShardedModule::describe_options() const {
  std::vector<std::pair<std::string, std::string>> options;
  describe(options_, "", options);
  return options;
}

std::string ShardedModule::plan_summary() const {
  const size_t n = plan_.units.size();
  std::string hybrid;
  if (replicate_group_) {
    hybrid = ", hybrid: " + std::to_string(replicate_group_->world_size()) + " replicas of " +
             std::to_string(shard_group_->world_size()) +
             (shard_group_->world_size() == 1 ? " shard" : " shards");
  }
  return std::to_string(n) + (n == 1 ? " unit (" : " units (") + style_name(options_.style) +
         hybrid + ")";
}

const layout::TensorLayouts& ShardedModule::layouts() const {
  require_between_steps("layouts");
  return layouts_;
}

layout::Layout ShardedModule::layout(const std::string& name) const {
  const auto it = layouts_.by_name.find(name);  // every name of a tied parameter is there
  TORCH_CHECK(it != layouts_.by_name.end(),
              "ddp: ShardedModule::layout: the module has no parameter '", name, "'");
  return it->second;
}

void ShardedModule::begin_evaluation() {
  TORCH_CHECK(phase_ == Phase::kIdle,
              "ddp: model.evaluation() between steps only (a forward or a backward is under way)");
  // As an evaluation forward: rank 0's buffers first (ShardOptions::broadcast_buffers).
  if (options_.broadcast_buffers) sync_buffers_for(ForwardKind::kEvaluationScope);
  schedule_->gather_all();
  phase_ = Phase::kEvaluation;
}

void ShardedModule::end_evaluation() {
  schedule_->reshard_all();
  phase_ = Phase::kIdle;
}

void ShardedModule::reshard() {
  schedule_->reshard_all();
  if (gradients()) gradients()->reset();
  phase_ = Phase::kIdle;
}

}  // namespace ddp::shard
