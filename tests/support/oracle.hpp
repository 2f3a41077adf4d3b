#pragma once
// The single-process oracle and its distributed twin: the same workload, seed, optimizer and
// global batches; the oracle trains on each whole global batch, a rank on its shard. Equivalence
// means their parameters agree to fp32 rounding.

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/parallel/ddp_options.hpp"

namespace ddp::testing {

// The tests' optimizers, one per kind, for the oracle and the rank alike: "sgd" (lr, momentum
// 0.9), "plain-sgd" (lr, no momentum: libtorch's momentum refuses sparse gradients), "adam" (lr /
// 10), "adamw" (lr / 10, weight decay 0.1). Any other kind is refused by name.
std::unique_ptr<torch::optim::Optimizer> make_test_optimizer(const std::string& kind,
                                                             std::vector<torch::Tensor> params,
                                                             double lr = 0.1);

struct TrainSpec {
  std::string model = "net";      // a workload name (make_test_workload)
  int64_t dim = 0;                // workload width; 0 = its default
  std::string optimizer = "sgd";  // a make_test_optimizer kind, at `lr`
  int steps = 3;
  int64_t global_batch = 12;  // divisible by 1, 2, 3 and 4
  double lr = 0.05;
  // no_sync: each step is `micro_batches` global micro-batches; a rank runs the first
  // micro_batches-1 under no_sync and the last synchronized. The oracle sums the micro-batch
  // losses.
  int micro_batches = 1;
  // "cpu", or "cuda": the model and batches on cuda:<LOCAL_RANK> (the oracle on the same GPU).
  std::string device = "cpu";
  bool autocast_bf16 = false;  // forward and loss under bf16 autocast
};

struct TrainResult {
  std::vector<std::string> names;     // distinct parameters, registration order
  std::vector<torch::Tensor> params;  // after training
  std::vector<std::string> buffer_names;
  std::vector<torch::Tensor> buffers;  // after training
};

// Single process on the global batch. For models with BatchNorm the loss is the mean of the
// per-shard losses with each shard normalized by its own statistics, as DDP does; `world` says how
// many shards.
TrainResult train_single(const TrainSpec& spec, int world);

// This rank's DDP training. Ranks other than 0 perturb their initial parameters first, so the
// result also checks that construction broadcasts rank 0's state.
TrainResult train_ddp(const TrainSpec& spec, comm::ProcessGroupPtr pg,
                      const parallel::DDPOptions& options);

// This rank's training under any style, through parallel::data_parallel over `mesh` (hybrid
// sharding over dims ("replicate", "shard"), else its data-parallel group): the batches and
// no_sync of train_ddp, the global batch split over every rank of the mesh. Returns the whole
// parameters (gathered by layout, io::whole_state: the same on every rank) and this rank's
// buffers. Ranks other than 0 perturb their initial parameters first, as train_ddp.
// `hook`: registered on the wrapper before the first step (null: the built-in average).
TrainResult train_data_parallel(const TrainSpec& spec, const comm::DeviceMesh& mesh,
                                parallel::DataParallelStyle style,
                                const parallel::DataParallelOptions& options = {},
                                hooks::CommHookPtr hook = nullptr);

// The workload's parameters as constructed (before any training step), on the CPU.
TrainResult initial_params(const TrainSpec& spec);

// Per tensor, equal shapes, ||a - b|| / ||b|| <= rtol, and b is not all zeros; throws naming the
// first tensor that differs and by how much.
void require_close(const std::vector<std::string>& names, const std::vector<torch::Tensor>& a,
                   const std::vector<torch::Tensor>& b, double rtol, const std::string& context);

}  // namespace ddp::testing
