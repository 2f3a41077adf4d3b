// Every collective of ProcessGroup on an empty tensor gives a result (empty, of the right shape),
// not a crash (Gloo's list all-gather of zero elements divides by zero: SIGFPE), and the group's
// collectives after it still pair up across ranks. Worlds 1, 2 and 3.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/comm/process_group.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

DDP_TEST_WORKER(empty_collectives) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const int w = pg->world_size();
  const auto empty = [] { return torch::zeros({0, 3}); };

  auto t = empty();
  pg->allreduce_sum(t, "an empty all-reduce (sum)");
  require(t.sizes() == torch::IntArrayRef({0, 3}), "the empty all-reduce changed its shape");
  auto avg = empty();
  pg->wait(pg->allreduce_avg_async(avg), "an empty all-reduce (average)");
  std::vector<torch::Tensor> list{empty(), torch::zeros({0})};
  pg->wait(pg->allreduce_avg_coalesced_async(list), "an empty coalesced all-reduce");
  auto b = empty();
  pg->broadcast(b, /*root=*/0, "an empty broadcast");
  const auto each = pg->all_gather_each(empty(), "an empty list all-gather");
  require(static_cast<int>(each.size()) == w,
          "the empty list all-gather gave " + std::to_string(each.size()) + " tensors");
  for (const auto& e : each) {
    require(e.sizes() == torch::IntArrayRef({0, 3}), "an empty gathered tensor has another shape");
  }
  require(pg->reduce_scatter(torch::zeros({0}), comm::ReduceOp::kAvg, "an empty reduce-scatter")
                  .numel() == 0,
          "the empty reduce-scatter is not empty");
  require(pg->all_gather(torch::zeros({0}), 0, "an empty all-gather").numel() == 0,
          "the empty all-gather is not empty");
  pg->barrier("a barrier after the empty collectives");

  // The ranks still pair up: a sum of the ranks, and every rank's row gathered.
  auto sum = torch::full({1}, static_cast<float>(pg->rank()));
  pg->allreduce_sum(sum, "the all-reduce after the empty collectives");
  require(sum.item<float>() == static_cast<float>(w * (w - 1) / 2),
          "the all-reduce after the empty collectives gave " + std::to_string(sum.item<float>()));
  const auto rows = pg->all_gather_each(torch::full({2}, static_cast<float>(pg->rank())),
                                        "the list all-gather after the empty collectives");
  for (int r = 0; r < w; ++r) {
    require(torch::equal(rows[static_cast<size_t>(r)], torch::full({2}, static_cast<float>(r))),
            "rank " + std::to_string(r) + "'s gathered row is wrong");
  }
}

class EmptyCollectives : public ::testing::TestWithParam<int> {};

TEST_P(EmptyCollectives, EveryCollectiveOfAnEmptyTensorGivesAnEmptyResult) {
  EXPECT_WORKERS_PASS(run_workers(empty_collectives, GetParam()));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, EmptyCollectives, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace ddp::testing
