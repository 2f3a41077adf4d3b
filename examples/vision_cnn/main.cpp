// vision_cnn: a small CNN with BatchNorm trained data-parallel as a vision user trains one. Its
// BatchNorms are ddp::nn::SyncBatchNorm2d (statistics over every rank's images, as one process
// would compute them on the global batch); every --eval-every steps every rank evaluates inside
// model.evaluation() (eval mode, no grad, rank 0's buffers, the parameters whole under a sharded
// style) on its part of the validation set, and ddp::comm::reduce_metric adds the parts up. On
// GPUs the images are channels_last and the forward runs under bf16 autocast.
//
// Build against an installed libddp (cmake --install build --prefix <prefix>):
//   cmake -S examples/vision_cnn -B /tmp/vision_cnn -DCMAKE_PREFIX_PATH=<prefix>
//   cmake --build /tmp/vision_cnn
// Run at world 2:
//   <prefix>/bin/ddp-run --nproc-per-node 2 -- /tmp/vision_cnn/vision_cnn --style fully_shard
// Flags: --style replicate|fully_shard|default, --steps N, --eval-every N, --device cpu|cuda.

#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "ddp/comm/init.hpp"
#include "ddp/comm/metric_reduction.hpp"
#include "ddp/data/distributed_sampler.hpp"
#include "ddp/nn/sync_batch_norm.hpp"
#include "ddp/parallel/autocast.hpp"
#include "ddp/parallel/data_parallel.hpp"

constexpr int64_t kClasses = 10, kSide = 16;

// Conv -> SyncBatchNorm -> ReLU twice, global average pool, a linear head.
struct CnnImpl : torch::nn::Module {
  CnnImpl() {
    conv1 = register_module(
        "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)));
    bn1 = register_module("bn1", ddp::nn::SyncBatchNorm2d(torch::nn::BatchNormOptions(16)));
    conv2 = register_module(
        "conv2",
        torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1).stride(2).bias(false)));
    bn2 = register_module("bn2", ddp::nn::SyncBatchNorm2d(torch::nn::BatchNormOptions(32)));
    head = register_module("head", torch::nn::Linear(32, kClasses));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(bn1(conv1(x)));
    h = torch::relu(bn2(conv2(h)));
    return head(h.mean({2, 3}));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  ddp::nn::SyncBatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Cnn);

// Synthetic images: class c is a colour grating at angle pi * c / 10 with a random phase, under
// N(0, 1) noise. Sample i of a set is the same on every rank (its own seed).
std::pair<torch::Tensor, torch::Tensor> images(int64_t first, int64_t n, uint64_t set) {
  auto x = torch::empty({n, 3, kSide, kSide});
  auto y = torch::empty({n}, torch::kLong);
  const auto pix = torch::arange(kSide, torch::kFloat);
  for (int64_t i = 0; i < n; ++i) {
    torch::manual_seed(set * 1000003 + static_cast<uint64_t>(first + i));
    const int64_t c = torch::randint(kClasses, {1}).item<int64_t>();
    const double angle = M_PI * static_cast<double>(c) / kClasses;
    const double phase = 2 * M_PI * torch::rand({1}).item<double>();
    const auto colour = torch::tensor({std::cos(angle), std::sin(angle), c % 2 ? 1.0 : -1.0});
    const auto wave = torch::cos(
        (pix.view({kSide, 1}) * std::cos(angle) + pix.view({1, kSide}) * std::sin(angle)) *
            (2 * M_PI * 3 / kSide) +
        phase);
    x[i] = torch::randn({3, kSide, kSide}) + colour.view({3, 1, 1}) * wave;
    y[i] = c;
  }
  return {x, y};
}

int run(int argc, char** argv) {
  std::string style_name = "replicate", device_name = "cpu";
  int64_t steps = 60, eval_every = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--style")) style_name = argv[i + 1];
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--eval-every")) eval_every = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--device")) device_name = argv[i + 1];
  }
  at::set_num_threads(1);
  const bool cuda = device_name == "cuda";
  ddp::comm::InitOptions init;
  init.backend = cuda ? "nccl" : "gloo";
  auto pg = ddp::comm::init_process_group(init);
  const torch::Device device =
      cuda ? torch::Device(torch::kCUDA,
                           static_cast<c10::DeviceIndex>(std::atoi(
                               std::getenv("LOCAL_RANK") ? std::getenv("LOCAL_RANK") : "0")))
           : torch::Device(torch::kCPU);
  // channels_last on GPUs: cuDNN's NHWC kernels, and SyncBatchNorm reads it as it is.
  const auto layout = [&](const torch::Tensor& t) {
    return cuda ? t.to(device).contiguous(torch::MemoryFormat::ChannelsLast) : t.to(device);
  };

  torch::manual_seed(0);
  Cnn net;
  net->to(device);
  // The wrapper binds every SyncBatchNorm to its group.
  auto model = ddp::data_parallel(net, pg, ddp::shard::parse_style(style_name));
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // The validation set, split over the ranks; padding (none at world 2) would not be counted.
  const int64_t valid_size = 400, batch = 32;  // batch: per rank and step
  ddp::data::SamplerOptions split;
  split.size = valid_size;
  split.world_size = pg->world_size();
  split.rank = pg->rank();
  split.shuffle = false;
  const ddp::data::DistributedSampler valid(split);
  const auto evaluate = [&](int64_t step, const char* label) {
    double loss_sum = 0, correct = 0;
    const auto indices = valid.epoch_indices(0);
    const int64_t mine = valid.real_samples();
    {
      auto evaluation = model.evaluation();  // every rank, between steps
      for (int64_t k = 0; k < mine; ++k) {
        auto [x, y] = images(indices[static_cast<size_t>(k)], 1, /*set=*/2);
        y = y.to(device);
        std::optional<ddp::parallel::AutocastGuard> bf16;
        if (cuda) bf16.emplace(c10::kCUDA, torch::kBFloat16);
        const auto logits = net->forward(layout(x)).to(torch::kFloat);
        loss_sum +=
            torch::nn::functional::cross_entropy(
                logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                .item<double>();
        correct += logits.argmax(1).eq(y).sum().item<double>();
      }
    }
    const auto loss = ddp::comm::reduce_metric(*pg, loss_sum, mine, "validation loss");
    const auto right = ddp::comm::reduce_metric(*pg, correct, mine, "validation accuracy");
    std::printf("rank %d: %s step %lld validation loss %.6f accuracy %.4f (%lld samples)\n",
                pg->rank(), label, static_cast<long long>(step), loss.mean(), right.mean(),
                static_cast<long long>(loss.count));
  };

  for (int64_t step = 1; step <= steps; ++step) {
    // The global batch of this step; this rank takes its slice.
    auto [x, y] = images((step - 1) * batch * pg->world_size() + pg->rank() * batch, batch, 1);
    optimizer.zero_grad();
    torch::Tensor logits;
    {
      std::optional<ddp::parallel::AutocastGuard> bf16;
      if (cuda) bf16.emplace(c10::kCUDA, torch::kBFloat16);
      logits = model(layout(x));
    }
    torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y.to(device)).backward();
    optimizer.step();
    if (step % eval_every == 0 && step != steps) evaluate(step, "at");
  }
  evaluate(steps, "final:");
  pg->barrier("end");
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "vision_cnn: %s\n", e.what_without_backtrace());
    return 1;
  }
}
