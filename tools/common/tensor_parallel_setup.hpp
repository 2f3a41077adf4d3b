#pragma once
// --tp N, shared by ddp-bench and ddp-train: the world as a (world / N, N) mesh ("dp", "tp"), the
// workload's plan applied over "tp", and what the data-parallel side then uses.

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/tp/parallelize.hpp"

namespace ddp::tools {

// --tp N (0, the default: no tensor parallelism).
void add_tp_flag(CLI::App& app, int64_t& tp);
// Why --tp cannot split `world` ranks ("" when it can, or tp is 0): it must divide them. The tools
// check it before any worker starts (the world their --nproc makes), and again in the worker.
std::string tp_world_refusal(int64_t tp, int64_t world);

struct TensorParallelSetup {
  std::unique_ptr<comm::DeviceMesh> mesh;               // null without --tp
  std::unique_ptr<tp::TensorParallel> tensor_parallel;  // null without --tp
  comm::ProcessGroupPtr dp_group;  // what DDP or a sharded style runs over: "dp", or the world
  int data_rank = 0;               // which samples this rank reads: its dp coordinate, or its rank
};

// With tp == 0, the world and this rank. Otherwise splits `workload`'s model (collective over the
// world); errors, prefixed with `tool`, name a tp size that does not divide the world and a model
// without a plan.
TensorParallelSetup setup_tensor_parallel(const std::string& tool, int64_t tp,
                                          const comm::ProcessGroupPtr& world,
                                          const models::Workload& workload,
                                          const std::string& model);

}  // namespace ddp::tools
