#include "ddp/comm/node_layout.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace ddp::comm {

namespace {

// A whole decimal integer in [lo, hi] from `text` (the variable `name`'s value), else refused.
int64_t parse_count(const std::string& name, const std::string& text, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  const bool ok = !text.empty() && end != nullptr && *end == '\0' && errno == 0;
  TORCH_CHECK(ok && value >= lo && value <= hi, "ddp: environment variable ", name, "='", text,
              "' is invalid: expected an integer in [", lo, ", ", hi, "]");
  return value;
}

// srun's SLURM_TASKS_PER_NODE: "4", "4(x2)", or a list for uneven nodes ("4(x2),2"), refused.
int64_t slurm_tasks_per_node(const std::string& text, int64_t world_size) {
  const std::string name = "SLURM_TASKS_PER_NODE";
  TORCH_CHECK(text.find(',') == std::string::npos, "ddp: environment variable ", name, "='", text,
              "' gives nodes of different sizes; hybrid sharding by node needs every node alike");
  const size_t paren = text.find('(');
  return parse_count(name, text.substr(0, paren), 1, world_size);
}

}  // namespace

NodeLayout node_layout_from_env(const EnvLookup& env, int64_t world_size) {
  const std::optional<std::string> launcher = launcher_from_env(env);
  std::string size_var, local_var;
  if (launcher == std::optional<std::string>("torchrun")) {
    size_var = "LOCAL_WORLD_SIZE";
    local_var = "LOCAL_RANK";
  } else if (launcher == std::optional<std::string>("openmpi")) {
    size_var = "OMPI_COMM_WORLD_LOCAL_SIZE";
    local_var = "OMPI_COMM_WORLD_LOCAL_RANK";
  } else if (launcher == std::optional<std::string>("slurm")) {
    size_var = "SLURM_NTASKS_PER_NODE";
    local_var = "SLURM_LOCALID";
  }
  // No launcher, or one that does not say: every rank on one node (the single-machine run).
  NodeLayout layout;
  layout.ranks_per_node = world_size;
  if (const auto text = size_var.empty() ? std::nullopt : env(size_var)) {
    layout.ranks_per_node = parse_count(size_var, *text, 1, world_size);
  } else if (const auto tasks = launcher == std::optional<std::string>("slurm")
                                    ? env("SLURM_TASKS_PER_NODE")
                                    : std::nullopt) {
    size_var = "SLURM_TASKS_PER_NODE";
    layout.ranks_per_node = slurm_tasks_per_node(*tasks, world_size);
  }
  TORCH_CHECK(world_size % layout.ranks_per_node == 0, "ddp: ", layout.ranks_per_node,
              " ranks per node (", size_var, ") do not divide the world size ", world_size);
  if (const auto local = local_var.empty() ? std::nullopt : env(local_var)) {
    layout.local_rank = parse_count(local_var, *local, 0, layout.ranks_per_node - 1);
  }
  return layout;
}

int64_t node_count(const ProcessGroupPtr& world, const EnvLookup& env) {
  TORCH_CHECK(world, "ddp: node_count needs a process group");
  const int64_t size = world->world_size();
  const NodeLayout mine = node_layout_from_env(env, size);
  // A launcher that does not say the local rank: this rank's place by node-major numbering.
  const int64_t local =
      mine.local_rank >= 0 ? mine.local_rank : world->rank() % mine.ranks_per_node;
  const at::Tensor here = at::tensor(std::vector<int64_t>{local, mine.ranks_per_node},
                                     at::TensorOptions().dtype(at::kLong).device(world->device()));
  const std::vector<at::Tensor> all = world->all_gather_each(here, "the node layout");
  for (int64_t r = 0; r < size; ++r) {
    const at::Tensor t = all[static_cast<size_t>(r)].cpu();
    const int64_t their_local = t[0].item<int64_t>();
    const int64_t their_size = t[1].item<int64_t>();
    TORCH_CHECK(their_size == mine.ranks_per_node,
                "ddp: the node layout differs across ranks: rank ", r, " has ", their_size,
                " ranks per node, rank ", world->rank(), " has ", mine.ranks_per_node);
    TORCH_CHECK(their_local == r % mine.ranks_per_node, "ddp: rank ", r, " is local rank ",
                their_local, " of its node, but ranks numbered node by node (", mine.ranks_per_node,
                " per node) put it at local rank ", r % mine.ranks_per_node,
                ": hybrid sharding by node needs each node's ranks consecutive (ddp-run, torchrun "
                "and srun's block distribution number them so)");
  }
  return size / mine.ranks_per_node;
}

DeviceMesh node_mesh(const ProcessGroupPtr& world, const EnvLookup& env) {
  const int64_t nodes = node_count(world, env);
  return DeviceMesh(world, {nodes, world->world_size() / nodes}, {"replicate", "shard"});
}

}  // namespace ddp::comm
