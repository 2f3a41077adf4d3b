// minimal_ddp: a complete data-parallel training program. Each rank reads its own shard of the
// data (DistributedSampler), DistributedDataParallel averages the gradients, so every rank holds
// the same model after every step: the same model that one process would train on all the data.
//
// Build against an installed libddp (cmake --install build --prefix <prefix>):
//   cmake -S examples/minimal_ddp -B /tmp/minimal -DCMAKE_PREFIX_PATH=<prefix>
//   cmake --build /tmp/minimal
// Run at world 2:
//   <prefix>/bin/ddp-run --nproc-per-node 2 -- /tmp/minimal/minimal_ddp
// or start one process per rank yourself, in two shells:
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 /tmp/minimal/minimal_ddp
//   RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 /tmp/minimal/minimal_ddp
// (torchrun, mpirun and srun work too: see the README's "Launching").

#include <ATen/Parallel.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>
#include <vector>

#include "ddp/comm/init.hpp"
#include "ddp/data/distributed_sampler.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"

int run() {
  at::set_num_threads(1);  // one process per core
  // Rendezvous through MASTER_ADDR:MASTER_PORT; RANK and WORLD_SIZE say who this process is.
  auto pg = ddp::comm::init_process_group();

  // A synthetic regression task, the same on every rank (same seed): y = x . w + noise.
  torch::manual_seed(0);
  const int64_t samples = 1024, batch_size = 16;  // batch_size: per rank and step
  const torch::Tensor x = torch::randn({samples, 8});
  const torch::Tensor y = x.mm(torch::randn({8, 1})) + 0.1 * torch::randn({samples, 1});

  // Each rank takes a disjoint 1/world of every epoch, shuffled anew each epoch.
  ddp::data::SamplerOptions data;
  data.size = samples;
  data.world_size = pg->world_size();
  data.rank = pg->rank();
  ddp::data::DistributedSampler sampler(data);

  // DDP checks that every rank built the same model and copies rank 0's parameters to all.
  torch::nn::Sequential net(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
  ddp::DistributedDataParallel<torch::nn::Sequential> model(net, pg);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.05));

  // The loss on the whole data set, evaluated by each rank on its own copy of the model.
  const auto full_loss = [&] {
    torch::NoGradGuard no_grad;
    return torch::mse_loss(net->forward(x), y).item<double>();
  };
  const double before = full_loss();
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler.set_epoch(epoch);  // a new order each epoch, the same one on every rank
    while (auto indices = sampler.next(batch_size)) {
      const torch::Tensor rows =
          torch::tensor(std::vector<int64_t>(indices->begin(), indices->end()));
      optimizer.zero_grad();
      torch::Tensor loss = torch::mse_loss(model(x.index_select(0, rows)), y.index_select(0, rows));
      loss.backward();   // gradients are averaged over the ranks here, during backward
      optimizer.step();  // the same update on every rank
    }
  }
  // Every rank ends with the same parameters, hence the same loss on the whole data set.
  std::printf("rank %d: world size %d, initial loss %.6f, final loss %.9g (all %lld samples)\n",
              pg->rank(), pg->world_size(), before, full_loss(), static_cast<long long>(samples));
  pg->barrier("end");
  return 0;
}

// A library error (a bad flag, a rank that died, a refused checkpoint) as one line, not a
// backtrace per rank.
int main() {
  try {
    return run();
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "minimal_ddp: %s\n", e.what_without_backtrace());
    return 1;
  }
}
