#include "ddp/parallel/data_parallel.hpp"

#include <c10/util/Exception.h>

#include <algorithm>

#include "ddp/comm/submesh.hpp"
#include "ddp/tp/parallelize.hpp"

namespace ddp::parallel {

comm::ProcessGroupPtr data_parallel_group(const comm::DeviceMesh& mesh) {
  const auto& names = mesh.dim_names();
  if (std::find(names.begin(), names.end(), "dp") != names.end()) return mesh.group("dp");
  if (mesh.ndim() == 1) return mesh.group(names[0]);
  std::string dims;
  for (const auto& n : names) dims += (dims.empty() ? "" : ", ") + n;
  TORCH_CHECK(false, "ddp: data_parallel over a ", mesh.ndim(),
              "-D mesh needs a mesh dim named 'dp' (or the dims replicate, shard of hybrid "
              "sharding); this mesh's dims are ",
              dims);
}

comm::Sharding over_tensor_parallel(const comm::Sharding& dp, const tp::TensorParallel& tp,
                                    comm::ProcessGroupPtr mesh_group) {
  return comm::nest(tp.sharding(), dp, std::move(mesh_group));
}

namespace {

// The refusals every make_wrapped makes before building anything.
void check_options(DataParallelStyle style, const DataParallelOptions& options) {
  const std::string conflict = style_conflict(style, options.shard.style);
  TORCH_CHECK(conflict.empty(), conflict);
  const std::string ignored = gather_setting_conflict(style, options.shard);
  TORCH_CHECK(ignored.empty(), ignored);
  const std::string buffers = buffer_setting_conflict(style, options);
  TORCH_CHECK(buffers.empty(), buffers);
}

bool has_dim(const comm::DeviceMesh& mesh, const std::string& dim) {
  const auto& names = mesh.dim_names();
  return std::find(names.begin(), names.end(), dim) != names.end();
}

bool hybrid_mesh(const comm::DeviceMesh& mesh) {
  return mesh.dim_names() == std::vector<std::string>({"replicate", "shard"});
}

}  // namespace

std::unique_ptr<wrap::WrappedModel> make_wrapped(std::shared_ptr<torch::nn::Module> module,
                                                 const comm::DeviceMesh& mesh,
                                                 DataParallelStyle style,
                                                 DataParallelOptions options) {
  // Hybrid beside other dims (tensor parallelism's "tp"): over the ranks that share this rank's
  // other coordinates, as FSDP2's fully_shard(mesh["replicate", "shard"]).
  if (mesh.ndim() > 2 && has_dim(mesh, "replicate") && has_dim(mesh, "shard")) {
    return make_wrapped(std::move(module), comm::submesh(mesh, {"replicate", "shard"}), style,
                        std::move(options));
  }
  if (!hybrid_mesh(mesh)) {
    return make_wrapped(std::move(module), data_parallel_group(mesh), style, std::move(options));
  }
  if (style == DataParallelStyle::kReplicate) {
    return make_wrapped(std::move(module), mesh.parent(), style, std::move(options));
  }
  check_options(style, options);
  options.shard.style = style;
  return std::make_unique<shard::ShardedModule>(std::move(module), mesh, std::move(options.shard));
}

std::unique_ptr<wrap::WrappedModel> make_wrapped(std::shared_ptr<torch::nn::Module> module,
                                                 comm::ProcessGroupPtr group,
                                                 DataParallelStyle style,
                                                 DataParallelOptions options) {
  check_options(style, options);
  TORCH_CHECK(group, "ddp::data_parallel needs a process group");
  if (style == DataParallelStyle::kReplicate) {
    return std::make_unique<DistributedDataParallelBase>(std::move(module), std::move(group),
                                                         std::move(options.ddp));
  }
  options.shard.style = style;
  return std::make_unique<shard::ShardedModule>(std::move(module), std::move(group),
                                                std::move(options.shard));
}

std::string style_conflict(DataParallelStyle style, DataParallelStyle in_options) {
  // shard.style's default is kFullyShard, indistinguishable from a deliberate kFullyShard: only
  // another value can be told apart, and is.
  if (in_options == DataParallelStyle::kFullyShard || in_options == style) return "";
  return std::string("ddp::data_parallel: DataParallelOptions::shard.style is ") +
         shard::style_name(in_options) + " but the style argument is " + shard::style_name(style) +
         ": the argument decides; leave shard.style at its default";
}

std::string gather_setting_conflict(DataParallelStyle style, const shard::ShardOptions& shard) {
  if (style != DataParallelStyle::kReplicate) return "";
  const char* field = shard.param_dtype ? "param_dtype" : shard.reduce_dtype ? "reduce_dtype" : "";
  if (*field == '\0') return "";
  return std::string("ddp::data_parallel: DataParallelOptions::shard.") + field +
         " is set but the style is replicate, which gathers and reduce-scatters nothing (every "
         "rank holds the parameters whole): for bf16 compute use autocast, for bf16 all-reduces a "
         "bf16 comm hook, or choose a sharded style";
}

std::string buffer_setting_conflict(DataParallelStyle style, const DataParallelOptions& options) {
  // Each style reads its own struct's broadcast_buffers; one turned off in the struct the style
  // does not read would be ignored.
  if (style == DataParallelStyle::kReplicate && !options.shard.broadcast_buffers) {
    return "ddp::data_parallel: DataParallelOptions::shard.broadcast_buffers is false but the "
           "style is replicate, which reads ddp.broadcast_buffers: set that one";
  }
  if (style != DataParallelStyle::kReplicate && !options.ddp.broadcast_buffers) {
    return std::string(
               "ddp::data_parallel: DataParallelOptions::ddp.broadcast_buffers is false "
               "but the style is ") +
           shard::style_name(style) + ", which reads shard.broadcast_buffers: set that one";
  }
  return "";
}

}  // namespace ddp::parallel
