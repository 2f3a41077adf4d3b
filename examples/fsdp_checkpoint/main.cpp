// fsdp_checkpoint: FULLY_SHARD training with a checkpoint and a resume.
//
// A residual MLP whose blocks are FULLY_SHARD units: between steps each rank holds 1/world of
// every parameter and of the optimizer's momentum; a block's parameters are gathered for its
// forward and again for its backward, and its gradients reduce-scattered. Every --save-every steps
// all ranks write a checkpoint together (each rank its own shard, rank 0 the manifest);
// --resume continues from the newest complete one. Each step trains on a fixed slice of the data
// (a function of the step and the rank), so a run stopped and resumed ends exactly where an
// uninterrupted run ends; the last line prints the loss and a parameter checksum to compare.
//
// Build against an installed libddp (cmake --install build --prefix <prefix>):
//   cmake -S examples/fsdp_checkpoint -B /tmp/fsdp -DCMAKE_PREFIX_PATH=<prefix>
//   cmake --build /tmp/fsdp && cd /tmp/fsdp
// Run at world 2, 10 steps (checkpoints at 5 and 10), then resume from step 10 and go on to 20:
//   <prefix>/bin/ddp-run --nproc-per-node 2 -- ./fsdp_checkpoint --dir ckpt --steps 10
//   <prefix>/bin/ddp-run --nproc-per-node 2 -- ./fsdp_checkpoint --dir ckpt --steps 20 --resume
// The second run's last line equals that of one uninterrupted run with --steps 20 (another
// --dir). Without ddp-run, start one process per rank with RANK=0|1 WORLD_SIZE=2
// MASTER_ADDR=127.0.0.1 MASTER_PORT=29500; torchrun, mpirun and srun work too (README).

#include <ATen/Parallel.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ddp/comm/init.hpp"
#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/shard/sharded_module.hpp"

// One residual block: a FULLY_SHARD unit.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim) : fc(register_module("fc", torch::nn::Linear(dim, dim))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t in, int64_t dim, int depth) {
    embed = register_module("embed", torch::nn::Linear(in, dim));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < depth; ++i) blocks->push_back(Block(dim));
    head = register_module("head", torch::nn::Linear(dim, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = embed(x);
    for (const auto& block : *blocks) {
      // run_unit marks a unit's forward (the C++ frontend has no forward hooks): FULLY_SHARD
      // gathers the block's parameters before it and frees them after. Without a sharded
      // wrapper it is just block->forward(x).
      x = ddp::unit::run_unit(
          *block, [&](const torch::Tensor& in) { return block->as<BlockImpl>()->forward(in); }, x);
    }
    return head(x);  // embed and head belong to the root unit, gathered for the whole step
  }
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::nn::ModuleList blocks{nullptr};
};
TORCH_MODULE(Net);

int run(int argc, char** argv) {
  std::string dir;
  int64_t steps = 20, save_every = 5;
  bool resume = false;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--dir") && has_value) {
      dir = argv[++i];
    } else if (!std::strcmp(argv[i], "--steps") && has_value) {
      steps = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--save-every") && has_value) {
      save_every = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--resume")) {
      resume = true;
    } else {
      std::fprintf(stderr, "usage: %s --dir DIR [--steps N] [--save-every K] [--resume]\n",
                   argv[0]);
      return 2;
    }
  }
  if (dir.empty() || steps < 1 || save_every < 1) {
    std::fprintf(stderr, "fsdp_checkpoint: --dir is required; --steps and --save-every >= 1\n");
    return 2;
  }
  at::set_num_threads(1);  // one process per core is the usual layout on a CPU node

  // Rendezvous from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (or mpirun's or srun's variables).
  auto pg = ddp::comm::init_process_group();
  const int rank = pg->rank(), world = pg->world_size();

  // Synthetic regression data, the same on every rank (same seed): y = tanh(x . w_true / 4).
  torch::manual_seed(0);
  const int64_t samples = 1024, features = 16, batch = 16;  // batch: per rank and step
  const torch::Tensor x_all = torch::randn({samples, features});
  const torch::Tensor y_all = torch::tanh(x_all.mm(torch::randn({features, 1})) / 4);

  // The wrapper broadcasts rank 0's initial parameters, then keeps only this rank's shards.
  ddp::shard::ShardOptions options;  // style FULLY_SHARD by default
  options.units = {"blocks.0", "blocks.1", "blocks.2"};
  ddp::shard::FullyShardedDataParallel<Net> model(Net(features, 64, 3), pg, options);
  // Built after wrapping: the optimizer steps the shards, and its momentum is sharded too.
  torch::optim::SGD optimizer(model.module()->parameters(),
                              torch::optim::SGDOptions(0.02).momentum(0.9));

  // What a checkpoint holds: parameters and optimizer state (split as the wrapper's sharding
  // says), the step, the data position and the CPU generator.
  ddp::io::TrainingState state;
  state.model = model.module().ptr().get();
  state.optimizer = &optimizer;
  state.sharding = model.sharding();
  ddp::io::CoordinatorOptions checkpoints;
  checkpoints.root = dir;
  int64_t first_step = 1;
  if (resume) {
    // Collective: rank 0 picks the newest checkpoint that verifies, every rank loads its pieces.
    if (const auto from = ddp::io::resume_latest(*pg, checkpoints, state)) {
      first_step = state.step + 1;
      if (rank == 0) {
        std::printf("resumed from %s at step %lld\n", from->dir.c_str(),
                    static_cast<long long>(state.step));
      }
    } else if (rank == 0) {
      std::printf("no checkpoint in %s: starting fresh\n", dir.c_str());
    }
  }

  double loss_value = 0, loss_sum = 0;  // the last step's loss; the sum since the last save
  for (int64_t step = first_step; step <= steps; ++step) {
    // This rank's rows of this step: a pure function of (step, rank), so a resume sees the
    // batches an uninterrupted run sees.
    const int64_t first_row = ((step - 1) * world + rank) * batch;
    const torch::Tensor rows = torch::arange(first_row, first_row + batch) % samples;
    optimizer.zero_grad();
    torch::Tensor loss =
        torch::mse_loss(model(x_all.index_select(0, rows)), y_all.index_select(0, rows));
    loss.backward();  // gradients reduce-scattered and averaged into each rank's shard here
    optimizer.step();

    torch::Tensor global = loss.detach().clone().reshape({1});  // the mean over ranks, to print
    pg->allreduce_sum(global, "loss");
    loss_value = global.item<double>() / world;
    loss_sum += loss_value;
    if (step % save_every == 0) {
      state.step = step;
      state.data_position = step * world * batch;
      // Collective; returns once the checkpoint is complete on disk for every rank.
      ddp::io::save_and_barrier(*pg, checkpoints, state);
      if (rank == 0) {
        std::printf("step %lld: mean loss of the last %lld steps %.6f, checkpoint saved\n",
                    static_cast<long long>(step), static_cast<long long>(save_every),
                    loss_sum / save_every);
      }
      loss_sum = 0;
    }
  }

  // A checksum of the whole parameters (gathered from the shards by the export, io::whole_state;
  // collective) to compare runs.
  const ddp::io::TensorMap whole = ddp::io::whole_state(*model.module(), model.sharding());
  double checksum = 0;
  for (const auto& item : model.module()->named_parameters()) {
    checksum += whole.at(item.key()).abs().sum().item<double>();
  }
  std::printf("rank %d: step %lld, final loss %.9g, parameter checksum %.9g\n", rank,
              static_cast<long long>(steps), loss_value, checksum);
  pg->barrier("end");
  return 0;
}

// A library error (a bad flag, a rank that died, a refused checkpoint) as one line, not a
// backtrace per rank.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "fsdp_checkpoint: %s\n", e.what_without_backtrace());
    return 1;
  }
}
