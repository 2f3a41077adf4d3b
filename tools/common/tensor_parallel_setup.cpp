#include "common/tensor_parallel_setup.hpp"

#include <c10/util/Exception.h>

#include <vector>

#include "common/flag_parse.hpp"

namespace ddp::tools {

void add_tp_flag(CLI::App& app, int64_t& tp) {
  const FlagGroup group(app, "Style");
  app.add_option("--tp", tp,
                 "tensor parallel over N ranks of a (world / N, N) mesh (\"dp\", \"tp\"); the "
                 "data-parallel style runs over \"dp\" (docs/tensor_parallel.md)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
}

std::string tp_world_refusal(int64_t tp, int64_t world) {
  if (tp == 0 || world % tp == 0) return "";
  return "--tp " + std::to_string(tp) + " does not divide the world size " + std::to_string(world);
}

TensorParallelSetup setup_tensor_parallel(const std::string& tool, int64_t tp,
                                          const comm::ProcessGroupPtr& world,
                                          const models::Workload& workload,
                                          const std::string& model) {
  TensorParallelSetup out;
  out.dp_group = world;
  out.data_rank = world ? world->rank() : 0;
  if (tp == 0) return out;
  const int64_t size = world->world_size();
  const std::string wrong = tp_world_refusal(tp, size);
  TORCH_CHECK(wrong.empty(), tool, ": ", wrong);
  TORCH_CHECK(!workload.tp_plan.empty(), tool, ": --tp: model ", model,
              " has no tensor-parallel plan (net, toy, toy8k, the GPTs and the Llamas have one)");
  out.mesh = std::make_unique<comm::DeviceMesh>(world, std::vector<int64_t>{size / tp, tp},
                                                std::vector<std::string>{"dp", "tp"});
  out.tensor_parallel = tp::parallelize_module(workload.ptr, (*out.mesh)["tp"], workload.tp_plan);
  out.dp_group = (*out.mesh)["dp"];
  out.data_rank = static_cast<int>(out.mesh->coordinate()[0]);
  return out;
}

}  // namespace ddp::tools
