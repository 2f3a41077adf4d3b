// The C ABI (include/ddp/c/ddp.h): each function checks its arguments, then calls the library.
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "binding_model.hpp"
#include "boundary.hpp"
#include "ddp/c/ddp.h"
#include "ddp/comm/broadcast_coalesced.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/hooks/default_hooks.hpp"
#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/obs/runtime_stats.hpp"
#include "ddp/optim/grad_clip.hpp"
#include "param_tree.hpp"

namespace ddp::c_abi {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

namespace {
std::atomic<uintptr_t> serials{0};
}  // namespace

uintptr_t next_handle_serial() { return serials++; }
uintptr_t handle_serials_issued() { return serials.load(); }

namespace {

struct Group {
  comm::ProcessGroupPtr pg;
};
struct Model {
  std::shared_ptr<BindingModel> ddp;
};

HandleTable<Group, ddp_group>& groups() {
  static HandleTable<Group, ddp_group> table(HandleKind::kGroup);
  return table;
}
HandleTable<Model, ddp_model>& models() {
  static HandleTable<Model, ddp_model> table(HandleKind::kModel);
  return table;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw AbiError(DDP_ERROR_INVALID_ARGUMENT, message);
}
void require_state(bool ok, const std::string& message) {
  if (!ok) throw AbiError(DDP_ERROR_INVALID_STATE, message);
}

// The `count` at::Tensor* behind `tensors`, each defined; `what` names the list in errors.
std::vector<at::Tensor> tensors_of(void* const* tensors, size_t count, const char* what) {
  require(count == 0 || tensors != nullptr, std::string(what) + " is NULL");
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < count; ++i) {
    require(tensors[i] != nullptr, std::string(what) + "[" + std::to_string(i) + "] is NULL");
    const at::Tensor& t = *static_cast<const at::Tensor*>(tensors[i]);
    require(t.defined(), std::string(what) + "[" + std::to_string(i) + "] is an undefined tensor");
    out.push_back(t);
  }
  return out;
}

std::vector<std::string> names_of(const char* const* names, size_t count) {
  require(count == 0 || names != nullptr, "names is NULL");
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    require(names[i] != nullptr, "names[" + std::to_string(i) + "] is NULL");
    out.emplace_back(names[i]);
  }
  return out;
}

// Every tensor on the device the group's backend reduces: CPU for gloo, CUDA for nccl. `names`
// (empty: none) name them in the error.
void require_device(const comm::ProcessGroup& pg, const std::vector<at::Tensor>& tensors,
                    const std::vector<std::string>& names = {}) {
  const bool cuda = pg.backend() == comm::Backend::kNccl;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const bool ok = cuda ? tensors[i].is_cuda() : tensors[i].device().is_cpu();
    const std::string named = names.empty() ? "" : " ('" + names[i] + "')";
    require(ok, "tensor " + std::to_string(i) + named + " is on " + tensors[i].device().str() +
                    ", but a " + pg.backend_name() + " group reduces " + (cuda ? "CUDA" : "CPU") +
                    " tensors");
  }
}

hooks::CommHookPtr hook_named(const std::string& name, const comm::ProcessGroupPtr& pg) {
  if (name == "none" || name == "allreduce") return nullptr;  // the built-in average
  if (name == "fp16") return hooks::fp16_compress_hook(pg);
  if (name == "bf16") return hooks::bf16_compress_hook(pg);
  throw AbiError(DDP_ERROR_INVALID_ARGUMENT,
                 "comm_hook '" + name + "' is not one of none (or allreduce), fp16, bf16");
}

}  // namespace
}  // namespace ddp::c_abi

using namespace ddp::c_abi;  // NOLINT: the exported functions below are the boundary's

extern "C" {

int ddp_abi_version(void) { return DDP_ABI_VERSION; }

const char* ddp_version(void) { return DDP_VERSION_STRING; }

const char* ddp_last_error(void) { return last_error().c_str(); }

void ddp_group_options_init(ddp_group_options* options) {
  if (options == nullptr) return;
  options->backend = nullptr;
  options->timeout_ms = 0;
  options->rank = -1;
  options->world_size = -1;
  options->master_addr = nullptr;
  options->master_port = 0;
}

ddp_status ddp_group_create(const ddp_group_options* options, ddp_group** group) {
  return guarded("ddp_group_create", [&] {
    require(group != nullptr, "the group out-pointer is NULL");
    ddp_group_options o;
    ddp_group_options_init(&o);
    if (options != nullptr) o = *options;
    require(o.timeout_ms >= 0, "timeout_ms " + std::to_string(o.timeout_ms) + " is negative");
    ddp::comm::InitOptions init;
    if (o.backend != nullptr) init.backend = o.backend;
    if (o.timeout_ms > 0) init.timeout = std::chrono::milliseconds(o.timeout_ms);
    // Explicit values take the place of the launcher's variables, read the same way.
    const ddp::comm::EnvLookup env = ddp::comm::process_env();
    const auto overlay = [&](const std::string& name) -> std::optional<std::string> {
      if (name == "RANK" && o.rank >= 0) return std::to_string(o.rank);
      if (name == "WORLD_SIZE" && o.world_size >= 0) return std::to_string(o.world_size);
      if (name == "MASTER_ADDR" && o.master_addr != nullptr) return std::string(o.master_addr);
      if (name == "MASTER_PORT" && o.master_port > 0) return std::to_string(o.master_port);
      return env(name);
    };
    init.world = ddp::comm::world_info_from_env(overlay);
    auto pg = ddp::comm::init_process_group(init);
    *group = groups().add(std::make_shared<Group>(Group{std::move(pg)}));
  });
}

ddp_status ddp_group_rank(const ddp_group* group, int* rank) {
  return guarded("ddp_group_rank", [&] {
    const auto g = groups().get(group);
    require(rank != nullptr, "rank is NULL");
    *rank = g->pg->rank();
  });
}

ddp_status ddp_group_world_size(const ddp_group* group, int* world_size) {
  return guarded("ddp_group_world_size", [&] {
    const auto g = groups().get(group);
    require(world_size != nullptr, "world_size is NULL");
    *world_size = g->pg->world_size();
  });
}

ddp_status ddp_group_free(ddp_group* group) {
  return guarded("ddp_group_free", [&] { groups().remove(group); });
}

ddp_status ddp_broadcast(ddp_group* group, void* const* tensors, size_t count, int root) {
  return guarded("ddp_broadcast", [&] {
    const auto g = groups().get(group);
    require(root >= 0 && root < g->pg->world_size(), "root " + std::to_string(root) +
                                                         " is not a rank of a group of " +
                                                         std::to_string(g->pg->world_size()));
    const auto list = tensors_of(tensors, count, "tensors");
    require_device(*g->pg, list);
    ddp::comm::broadcast_coalesced(*g->pg, list, root, "ddp_broadcast");
  });
}

void ddp_options_init(ddp_options* options) {
  if (options == nullptr) return;
  options->first_bucket_cap_mb = 1.0;
  options->bucket_cap_mb = 25.0;
  options->find_unused_parameters = 0;
  options->static_graph = 0;
  options->gradient_as_bucket_view = 1;
  options->comm_hook = nullptr;
}

ddp_status ddp_model_create(ddp_group* group, void* const* params, const char* const* names,
                            size_t count, const ddp_options* options, ddp_model** model) {
  return guarded("ddp_model_create", [&] {
    const auto g = groups().get(group);
    require(model != nullptr, "the model out-pointer is NULL");
    require(count > 0, "no parameters (count is 0)");
    const auto tensors = tensors_of(params, count, "params");
    const auto list = names_of(names, count);
    require_device(*g->pg, tensors, list);
    for (size_t i = 0; i < count; ++i) {
      require(tensors[i].is_leaf(), "parameter " + std::to_string(i) + " ('" + list[i] +
                                        "') is not a leaf tensor (computed from others)");
    }
    ddp_options o;
    ddp_options_init(&o);
    if (options != nullptr) o = *options;
    require(o.first_bucket_cap_mb > 0 && o.bucket_cap_mb > 0, "bucket caps must be positive");
    ddp::parallel::DDPOptions ddp;
    ddp.gradients.buckets.first_bucket_cap_bytes = ddp::buckets::mib_bytes(o.first_bucket_cap_mb);
    ddp.gradients.buckets.bucket_cap_bytes = ddp::buckets::mib_bytes(o.bucket_cap_mb);
    ddp.gradients.find_unused_parameters = o.find_unused_parameters != 0;
    ddp.gradients.static_graph = o.static_graph != 0;
    ddp.gradients.gradient_as_bucket_view = o.gradient_as_bucket_view != 0;
    const std::string hook = o.comm_hook == nullptr ? "allreduce" : o.comm_hook;
    auto hook_ptr = hook_named(hook, g->pg);  // refused before anything collective
    auto ddp_model = std::make_shared<BindingModel>(param_tree(tensors, list), g->pg, ddp);
    if (hook_ptr) ddp_model->register_comm_hook(hook_ptr);
    *model = models().add(std::make_shared<Model>(Model{std::move(ddp_model)}));
  });
}

ddp_status ddp_model_free(ddp_model* model) {
  return guarded("ddp_model_free", [&] { models().remove(model); });
}

ddp_status ddp_model_forward_begin(ddp_model* model) {
  return guarded("ddp_model_forward_begin", [&] {
    const auto m = models().get(model);
    require_state(m->ddp->phase() == BindingModel::Phase::kIdle,
                  "ddp_model_forward_begin was called twice without ddp_model_forward_end");
    m->ddp->open_forward();
  });
}

ddp_status ddp_model_forward_end(ddp_model* model, void* const* outputs, size_t count) {
  return guarded("ddp_model_forward_end", [&] {
    const auto m = models().get(model);
    require_state(m->ddp->phase() == BindingModel::Phase::kInForward,
                  "no ddp_model_forward_begin before it");
    require(count > 0,
            "no outputs (count is 0): pass the forward's output tensors, from which the "
            "gradient-ready order is predicted and unused parameters are found");
    m->ddp->close_forward(tensors_of(outputs, count, "outputs"));
  });
}

ddp_status ddp_model_no_sync_begin(ddp_model* model) {
  return guarded("ddp_model_no_sync_begin", [&] {
    const auto m = models().get(model);
    require_state(!m->ddp->in_no_sync(), "already inside no_sync (no ddp_model_no_sync_end since)");
    m->ddp->begin_no_sync();
  });
}

ddp_status ddp_model_no_sync_end(ddp_model* model) {
  return guarded("ddp_model_no_sync_end", [&] {
    const auto m = models().get(model);
    require_state(m->ddp->in_no_sync(), "no ddp_model_no_sync_begin before it");
    m->ddp->end_no_sync();
  });
}

ddp_status ddp_model_zero_grad(ddp_model* model) {
  return guarded("ddp_model_zero_grad", [&] { models().get(model)->ddp->zero_grad(); });
}

ddp_status ddp_model_clip_grad_norm(ddp_model* model, double max_norm, double* total_norm) {
  return guarded("ddp_model_clip_grad_norm", [&] {
    const auto m = models().get(model);
    require(max_norm > 0, "max_norm " + std::to_string(max_norm) + " must be positive");
    ddp::optim::ClipOptions options;
    options.max_norm = max_norm;
    // Every rank holds the whole averaged gradients: the norm needs no communication.
    const auto result =
        ddp::optim::clip_grad_norm(ddp::optim::grad_shards(*m->ddp->module_ptr()), options);
    if (total_norm != nullptr) *total_norm = result.norm();
  });
}

ddp_status ddp_model_stats(ddp_model* model, char* text, size_t size, size_t* needed) {
  return guarded("ddp_model_stats", [&] {
    const auto m = models().get(model);
    require(size == 0 || text != nullptr, "text is NULL but size is " + std::to_string(size));
    const std::string stats = ddp::obs::format_summary(m->ddp->logging_data());
    if (needed != nullptr) *needed = stats.size() + 1;
    if (size == 0) return;
    const size_t n = std::min(size - 1, stats.size());
    std::memcpy(text, stats.data(), n);
    text[n] = '\0';
  });
}

ddp_status ddp_checkpoint_save(ddp_group* group, const char* root, void* const* tensors,
                               const char* const* names, size_t count, int64_t step) {
  return guarded("ddp_checkpoint_save", [&] {
    const auto g = groups().get(group);
    require(root != nullptr && *root != '\0', "root is NULL or empty");
    require(step >= 0, "step " + std::to_string(step) + " is negative");
    const auto list = names_of(names, count);
    const auto tree = param_tree(tensors_of(tensors, count, "tensors"), list);
    ddp::io::TrainingState state;
    state.model = tree.get();
    state.step = step;
    ddp::io::CoordinatorOptions options;
    options.root = root;
    ddp::io::save_and_barrier(*g->pg, options, state);
  });
}

ddp_status ddp_checkpoint_load(ddp_group* group, const char* root, void* const* tensors,
                               const char* const* names, size_t count, int64_t* step) {
  return guarded("ddp_checkpoint_load", [&] {
    const auto g = groups().get(group);
    require(root != nullptr && *root != '\0', "root is NULL or empty");
    require(step != nullptr, "step is NULL");
    const auto list = names_of(names, count);
    const auto tree = param_tree(tensors_of(tensors, count, "tensors"), list);
    ddp::io::TrainingState state;
    state.model = tree.get();
    ddp::io::CoordinatorOptions options;
    options.root = root;
    const auto loaded = ddp::io::resume_latest(*g->pg, options, state);
    *step = loaded ? state.step : -1;
  });
}

}  // extern "C"
