// reduce_scatter and all_gather over flat tensors: the even split rule, sum and average, sizes
// that divide, that do not, and that leave shards empty, at world sizes 1, 2 and 3. On Gloo both
// are the emulation ([Note: flat collectives] in process_group.hpp); the results are the same.

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "ddp/comm/backend.hpp"
#include "ddp/comm/control_scalars.hpp"
#include "ddp/comm/flat_shards.hpp"
#include "ddp/comm/process_group.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using comm::FlatShards;
using comm::ReduceOp;

TEST(FlatShards, EvenSplitRule) {
  // {numel, world} -> lengths by rank.
  struct Case {
    int64_t numel;
    int world;
    std::vector<int64_t> lengths;
  };
  for (const Case& c :
       {Case{6, 3, {2, 2, 2}}, Case{7, 3, {3, 3, 1}}, Case{1, 3, {1, 0, 0}}, Case{2, 3, {1, 1, 0}},
        Case{0, 3, {0, 0, 0}}, Case{7, 2, {4, 3}}, Case{5, 1, {5}}, Case{4, 3, {2, 2, 0}}}) {
    const FlatShards layout{c.numel, c.world};
    int64_t offset = 0;
    for (int r = 0; r < c.world; ++r) {
      EXPECT_EQ(layout.length(r), c.lengths[static_cast<size_t>(r)])
          << "numel " << c.numel << " world " << c.world << " rank " << r;
      EXPECT_EQ(layout.offset(r), offset) << "numel " << c.numel << " rank " << r;
      offset += layout.length(r);
    }
    EXPECT_EQ(offset, c.numel);
    EXPECT_EQ(layout.padded_numel(), c.world * layout.chunk());
    EXPECT_EQ(layout.even(), c.numel % c.world == 0) << c.numel << " over " << c.world;
  }
}

TEST(Backend, ParsesNamesAndRefusesOthers) {
  EXPECT_EQ(comm::parse_backend("gloo"), comm::Backend::kGloo);
  EXPECT_EQ(comm::parse_backend("nccl"), comm::Backend::kNccl);
  EXPECT_STREQ(comm::backend_name(comm::Backend::kNccl), "nccl");
  try {
    comm::parse_backend("mpi");
    FAIL() << "mpi must be refused";
  } catch (const c10::Error& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()),
              "ddp: unknown backend 'mpi': expected 'gloo' or 'nccl'");
  }
}

TEST(Backend, TraitsSayWhatEachDoesNatively) {
  static_assert(comm::traits(comm::Backend::kNccl).reduces_avg);
  static_assert(!comm::traits(comm::Backend::kGloo).reduces_avg);
  EXPECT_FALSE(comm::traits(comm::Backend::kGloo).sums_bf16);
  EXPECT_FALSE(comm::traits(comm::Backend::kGloo).flat_collectives);
  EXPECT_TRUE(comm::traits(comm::Backend::kNccl).flat_collectives);
  EXPECT_TRUE(comm::traits(comm::Backend::kNccl).waits_on_stream);
  EXPECT_EQ(comm::traits(comm::Backend::kNccl).device_type, c10::DeviceType::CUDA);
  EXPECT_EQ(comm::traits(comm::Backend::kGloo).device_type, c10::DeviceType::CPU);
}

// Rank r's input has element i = r * 1000 + i, so the sum over W ranks is
// 1000 * W(W-1)/2 + W * i and the average 1000 * (W-1)/2 + i.
torch::Tensor input_of(int rank, int64_t numel, const c10::Device& device) {
  return (torch::arange(numel, torch::kFloat) + 1000.0f * static_cast<float>(rank)).to(device);
}

torch::Tensor reduced(int world, int64_t numel, ReduceOp op) {
  const auto i = torch::arange(numel, torch::kFloat);
  const double w = world;
  if (op == ReduceOp::kSum) return i * w + 1000.0 * w * (w - 1) / 2;
  return i + 1000.0 * (w - 1) / 2;
}

void require_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  require(got.sizes() == want.sizes(), what + ": " + std::to_string(got.numel()) +
                                           " elements, expected " + std::to_string(want.numel()));
  require(want.numel() == 0 || torch::allclose(got.cpu(), want.cpu(), 1e-6, 1e-4),
          what + ": wrong values");
}

struct BackendCase {
  // nccl runs the same on GPUs (the native path); gloo the emulation.
  std::string backend = "gloo";
  DDP_CASE_FIELDS(backend)
};

DDP_TEST_WORKER_WITH(flat_collectives, BackendCase, c) {
  const std::string& backend = c.backend;
  if (backend == "nccl") {
    const int local_rank = std::stoi(worker_env("LOCAL_RANK", "0"));
    c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
        ->setDevice(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank)));
  }
  auto pg = worker_process_group(std::chrono::seconds(60), backend);
  const int w = pg->world_size();
  const int r = pg->rank();
  const c10::Device device = pg->device();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    const std::string op_name = op == ReduceOp::kSum ? "sum" : "avg";
    // All sizes in flight at once, then waited for in order: each handle keeps its own result.
    std::vector<int64_t> sizes = {0, 1, 2, 6, 7};
    std::vector<comm::PendingCollective> pending;
    std::vector<torch::Tensor> inputs;
    for (int64_t n : sizes) {
      inputs.push_back(input_of(r, n, device));
      pending.push_back(pg->reduce_scatter_async(inputs.back(), op));
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t n = sizes[k];
      const FlatShards layout{n, w};
      const std::string what = "reduce-scatter " + op_name + " of " + std::to_string(n);
      const auto shard = pending[k].wait(what);
      require_close(shard, reduced(w, n, op).narrow(0, layout.offset(r), layout.length(r)), what);
      require_close(inputs[k], input_of(r, n, device), what + " changed its input");
    }
  }
  // All-gather: rank r holds element i of its shard as r * 1000 + (global index), so the
  // gathered element i is owner(i) * 1000 + i with owner(i) = i / chunk.
  for (int64_t n : {0, 1, 2, 6, 7}) {
    const FlatShards layout{n, w};
    const auto shard =
        (torch::arange(layout.offset(r), layout.offset(r) + layout.length(r), torch::kFloat) +
         1000.0f * static_cast<float>(r))
            .to(device);
    auto want = torch::arange(n, torch::kFloat);
    if (n > 0) want += 1000.0f * torch::div(want, static_cast<double>(layout.chunk()), "floor");
    const std::string what = "all-gather of " + std::to_string(n);
    require_close(pg->all_gather(shard, n, what), want, what);
    // Into a caller's output that is not one flat block (every other column of a 2-D tensor).
    auto wide = torch::full({n, 2}, -1.0f, torch::TensorOptions().device(device));
    auto column = wide.select(1, 0);
    pg->all_gather_async(shard, column).wait(what + " into a strided output");
    require_close(column, want, what + " into a strided output");
    require(n == 0 || wide.select(1, 1).eq(-1.0f).all().item<bool>(),
            what + " wrote outside its output");
  }
  // A shard of the wrong length names the rule.
  std::string error;
  try {
    pg->all_gather(torch::zeros({5}, torch::TensorOptions().device(device)), 7, "bad all-gather");
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  require(error.find("the shard has 5 elements, but rank " + std::to_string(r) +
                     "'s shard of 7 elements has " + std::to_string(FlatShards{7, w}.length(r))) !=
              std::string::npos,
          "shard length error: " + error);
  // Control scalars: made on the group's device, read back as host integers.
  auto counts = comm::control_tensor(*pg, {r, 1});
  require(counts.device() == pg->device() && counts.scalar_type() == torch::kLong,
          "control tensor is not a Long tensor on the group's device");
  pg->allreduce_sum(counts, "control all-reduce");
  require(comm::read_scalars(counts) == std::vector<int64_t>{w * (w - 1) / 2, w},
          "control all-reduce gave the wrong counts");
  require(comm::read_scalar(counts, 1) == w, "read_scalar(1) is not the world size");
}

DDP_WORLD_SUITE(FlatCollectives, 1, 2, 3);

DDP_WORKER_TEST_P(FlatCollectives, ClosedFormResultsForEvenUnevenAndEmptyShards, flat_collectives);

std::string world_name(const ::testing::TestParamInfo<int>& info) {
  return "world" + std::to_string(info.param);
}

// The native NCCL path (`_reduce_scatter_base`, `_allgather_base`), on the device machine.
class FlatCollectivesNccl : public ::testing::TestWithParam<int> {};

TEST_P(FlatCollectivesNccl, ClosedFormResultsForEvenUnevenAndEmptyShards) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (static_cast<int>(torch::cuda::device_count()) < GetParam()) {
    GTEST_SKIP() << "needs " << GetParam() << " GPUs, found " << torch::cuda::device_count();
  }
  EXPECT_WORKERS_PASS(
      run_workers(flat_collectives, GetParam(), BackendCase{"nccl"}, {{"NCCL_NVLS_ENABLE", "0"}}));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FlatCollectivesNccl, ::testing::Values(1, 2, 3, 4),
                         world_name);

}  // namespace
}  // namespace ddp::testing
