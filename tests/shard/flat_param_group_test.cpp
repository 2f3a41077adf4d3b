// FlatParamGroup at world 1, 2 and 3 on Gloo (the emulated flat collectives): the shards hold
// this rank's rows with zero padding, unshard gives back the full values, reduce_scatter_grads
// gives each rank its rows of the average (closed form), and FULLY_SHARD training with SGD +
// momentum on the shards ends equal to single-process training on the global batch.

#include "ddp/shard/flat_param_group.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/error_text.hpp"
#include "support/oracle_twin.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using shard::DataParallelStyle;
using shard::FlatParamGroup;
using shard::ParamShape;
using shard::ShardedState;

std::vector<ParamShape> shapes_of(torch::nn::Module& m) {
  std::vector<ParamShape> out;
  for (const auto& item : m.named_parameters()) {
    out.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type()});
  }
  return out;
}

// Rows 7 and 3 split unevenly at world 2 and 3; [2, 4] has fewer rows than 3 ranks.
torch::nn::Sequential make_net() {
  return torch::nn::Sequential(torch::nn::Linear(5, 7), torch::nn::ReLU(), torch::nn::Linear(7, 3),
                               torch::nn::Linear(3, 2));
}

// The reduce-scatter copy-in by closed form: rank k's row holds, member after member, rows
// [k * chunk, (k + 1) * chunk) of each gradient and zeros past its end; an undefined gradient is
// zeros. The fused path (one at::_chunk_cat kernel, torch >= 2.4) writes the same bytes as the
// copy per gradient, on CPU and, where there is one, on the GPU; rows 7, 3, 2 and 1 are uneven at
// worlds 2-4 and fewer than the ranks.
TEST(CopyIntoReduceInput, EqualsTheClosedFormFusedOrNot) {
  std::vector<torch::Device> devices{torch::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(torch::kCUDA);
  for (const auto& device : devices) {
    for (int world = 1; world <= 4; ++world) {
      const std::vector<std::vector<int64_t>> shapes{{7, 5}, {3}, {2, 4}, {1, 3}};
      std::vector<torch::Tensor> grads;
      std::vector<shard::ReduceInputBlock> blocks;
      int64_t s = 0;
      for (const auto& shape : shapes) {
        grads.push_back(torch::randn(shape, torch::TensorOptions().device(device)));
        const int64_t rows = shape[0];
        const int64_t row_numel = grads.back().numel() / rows;
        const int64_t chunk = (rows + world - 1) / world;
        blocks.push_back({rows, chunk, row_numel});
        s += chunk * row_numel;
      }
      for (const bool fused : {true, false}) {
        for (const bool with_hole : {false, true}) {
          std::vector<torch::Tensor> given = grads;
          if (with_hole) given[1] = torch::Tensor();  // a member without a gradient: zeros
          auto out = torch::full({world, s}, 7.0, torch::TensorOptions().device(device));
          shard::copy_into_reduce_input(out, given, blocks, world, fused);
          auto want = torch::zeros({world, s});
          int64_t offset = 0;
          for (size_t i = 0; i < given.size(); ++i) {
            const auto& b = blocks[i];
            for (int k = 0; k < world && given[i].defined(); ++k) {
              const int64_t first = std::min(b.rows, k * b.chunk);
              const int64_t n = std::min(b.rows, (k + 1) * b.chunk) - first;
              if (n <= 0) continue;
              want[k]
                  .narrow(0, offset, n * b.row_numel)
                  .copy_(given[i]
                             .cpu()
                             .reshape({b.rows, b.row_numel})
                             .narrow(0, first, n)
                             .reshape({-1}));
            }
            offset += b.chunk * b.row_numel;
          }
          EXPECT_TRUE(torch::equal(out.cpu(), want))
              << device << " world " << world << (fused ? " fused" : " per copy")
              << (with_hole ? " with an undefined gradient" : "");
        }
      }
    }
  }
}

DDP_TEST_WORKER(flat_param_group_closed_form) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  torch::manual_seed(0);
  auto net = make_net();
  std::vector<torch::Tensor> params = net->parameters();
  std::vector<torch::Tensor> original;
  for (const auto& p : params) original.push_back(p.detach().clone());
  const auto plan = shard::plan_shards(shapes_of(*net), {}, w, DataParallelStyle::kFullyShard);
  FlatParamGroup group(plan, 0, params, pg);
  require(group.state() == ShardedState::kSharded, "starts sharded");
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& s = plan.params[i];
    require(params[i].size(0) == s.chunk(), "shard rows of " + plan.shapes[i].name);
    const int64_t here = s.rows_on(r);
    const int64_t first = std::min<int64_t>(s.rows(), r * s.chunk());
    require(torch::equal(params[i].narrow(0, 0, here), original[i].narrow(0, first, here)),
            "shard values of " + plan.shapes[i].name);
    require(params[i].narrow(0, here, s.chunk() - here).eq(0).all().item<bool>(),
            "zero padding of " + plan.shapes[i].name);
  }
  const std::string wrong = error_of([&] { group.finish_reduce_scatter(torch::Tensor()); });
  require(wrong == "ddp: unit '<root>': finish_reduce_scatter in the sharded state",
          "state error: " + wrong);
  group.unshard();
  // [Note: releasing without set_]: released and gathered again, every parameter keeps its
  // storage object and its version (autograd's saved copies stay valid) and its values.
  std::vector<const c10::StorageImpl*> storages;
  std::vector<uint32_t> versions;
  for (const auto& p : params) {
    storages.push_back(p.storage().unsafeGetStorageImpl());
    versions.push_back(p._version());
  }
  require(group.transient_bytes() == group.full_bytes(), "the full buffer is counted");
  group.free_full();
  require(group.state() == ShardedState::kReleased && group.transient_bytes() == 0,
          "released: no memory behind the full buffer");
  require(params[0].storage().nbytes() == 0 && params[0].size(0) == original[0].size(0),
          "released parameters keep their full shapes");
  group.unshard();
  for (size_t i = 0; i < params.size(); ++i) {
    require(params[i].storage().unsafeGetStorageImpl() == storages[i] &&
                params[i]._version() == versions[i],
            "same storage object and version after gathering again: " + plan.shapes[i].name);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    require(torch::equal(params[i], original[i]), "unsharded values of " + plan.shapes[i].name);
    // Rank r's gradient: (r + 1) * (1 + the element index); the average is (w + 1) / 2 times it.
    params[i].mutable_grad() =
        (r + 1) * (1 + torch::arange(params[i].numel(), torch::kFloat)).view(params[i].sizes());
  }
  group.reduce_scatter_grads();
  require(group.state() == ShardedState::kSharded, "resharded after the reduce-scatter");
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& s = plan.params[i];
    const auto full =
        ((w + 1) / 2.0f) *
        (1 + torch::arange(original[i].numel(), torch::kFloat)).view(original[i].sizes());
    const int64_t here = s.rows_on(r);
    const int64_t first = std::min<int64_t>(s.rows(), r * s.chunk());
    const auto& g = params[i].grad();
    require(g.sizes() == params[i].sizes(), "gradient shard shape of " + plan.shapes[i].name);
    require(torch::allclose(g.narrow(0, 0, here), full.narrow(0, first, here), 1e-6, 1e-6),
            "averaged gradient rows of " + plan.shapes[i].name);
    require(g.narrow(0, here, s.chunk() - here).eq(0).all().item<bool>(),
            "gradient padding of " + plan.shapes[i].name);
  }
  // An evaluation pass (unshard, reshard) keeps the sharded gradients; a second backward without
  // zero_grad accumulates into them, as FSDP2 does.
  std::vector<torch::Tensor> first;
  for (const auto& p : params) first.push_back(p.grad().clone());
  group.unshard();
  require(!params[0].grad().defined(), "unshard sets the sharded gradient aside");
  group.reshard();
  for (size_t i = 0; i < params.size(); ++i) {
    require(torch::equal(params[i].grad(), first[i]), "reshard restores " + plan.shapes[i].name);
  }
  group.unshard();
  for (auto& p : params) {
    p.mutable_grad() = (r + 1) * (1 + torch::arange(p.numel(), torch::kFloat)).view(p.sizes());
  }
  group.reduce_scatter_grads();
  for (size_t i = 0; i < params.size(); ++i) {
    require(torch::allclose(params[i].grad(), 2 * first[i], 1e-6, 1e-6),
            "accumulated gradient of " + plan.shapes[i].name);
  }
}

// FULLY_SHARD by hand over the group: unshard, forward on this rank's slice of the global batch,
// backward, reduce-scatter, SGD + momentum on the shards. The oracle trains the same net on the
// whole global batch in this process.
DDP_TEST_WORKER(flat_param_group_training) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size(), r = pg->rank();
  TwinOptions same_start;
  same_start.rank_seeds = false;  // a group by hand broadcasts nothing
  OracleTwin<torch::nn::Sequential> twin(make_net, w, r, same_start);
  auto& net = twin.net();
  auto params = net->parameters();
  const auto plan = shard::plan_shards(shapes_of(*net), {}, w, DataParallelStyle::kFullyShard);
  FlatParamGroup group(plan, 0, params, pg);
  // The forward on the gathered parameters, then the gradients reduce-scattered into the shards
  // the optimizer steps.
  twin.regression_steps(
      [&](const torch::Tensor& x) {
        group.unshard();
        return net->forward(x);
      },
      /*steps=*/5, /*rows_per_rank=*/4, 5, 2, [&] { group.reduce_scatter_grads(); });
  group.unshard();
  std::vector<std::string> names;
  for (const auto& shape : plan.shapes) names.push_back(shape.name);
  require_close(names, params, twin.oracle()->parameters(), 1e-5, "fully sharded training");
}

DDP_WORLD_SUITE(FlatParamGroupTest, 1, 2, 3);

DDP_WORKER_TEST_P(FlatParamGroupTest, ShardsUnshardAndAveragedGradientShardsInClosedForm,
                  flat_param_group_closed_form);

DDP_WORKER_TEST_P(FlatParamGroupTest, FullyShardedSgdMomentumEqualsSingleProcessTraining,
                  flat_param_group_training);

}  // namespace
}  // namespace ddp::testing
