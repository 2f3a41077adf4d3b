// The fake backend (comm/fake_backend.hpp): every collective completes at once and leaves its
// buffers as they were, except the list all-gather, which gives every rank's slot this rank's
// input. One process plays rank 1 of 3: no peer is ever needed.

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "ddp/comm/fake_backend.hpp"
#include "ddp/comm/flat_shards.hpp"
#include "ddp/comm/process_group.hpp"

namespace {

using ddp::comm::ProcessGroup;

ddp::comm::ProcessGroupPtr fake_group(int rank, int size) {
  ProcessGroup::Config config;
  config.rank = rank;
  config.size = size;
  config.make_backend = ddp::comm::fake_backend_factory();
  return ProcessGroup::create(std::move(config), c10::make_intrusive<c10d::HashStore>());
}

TEST(FakeBackend, EveryCollectiveCompletesAtOnceAndLeavesItsBuffers) {
  auto pg = fake_group(/*rank=*/1, /*size=*/3);
  const auto x = torch::arange(7, torch::kFloat);
  auto t = x.clone();
  pg->allreduce_sum(t, "a fake all-reduce");
  EXPECT_TRUE(torch::equal(t, x));
  pg->broadcast(t, /*root=*/0, "a fake broadcast");
  EXPECT_TRUE(torch::equal(t, x));
  pg->barrier("a fake barrier");

  const auto each = pg->all_gather_each(x, "a fake list all-gather");
  ASSERT_EQ(each.size(), 3u);
  for (const auto& e : each) EXPECT_TRUE(torch::equal(e, x));

  // Rank 1's shard of 7 elements over 3 ranks (chunk 3): elements 3..5, reduced to itself.
  auto input = x.clone();
  const auto shard = pg->reduce_scatter(input, ddp::comm::ReduceOp::kSum, "a fake reduce-scatter");
  EXPECT_EQ(shard.numel(), (ddp::comm::FlatShards{7, 3}.length(1)));
  const auto gathered = pg->all_gather(x.narrow(0, 3, 3), 7, "a fake all-gather");
  EXPECT_EQ(gathered.numel(), 7);
  EXPECT_EQ(pg->collectives_issued(), 6);
}

// A comm hook reads a collective's future: it holds the tensors the collective was given.
TEST(FakeBackend, AFuturesValueIsTheCollectivesTensors) {
  auto pg = fake_group(/*rank=*/0, /*size=*/2);
  auto t = torch::ones({4});
  auto work = pg->allreduce_avg_async(t);
  const auto future = work->getFuture();
  ASSERT_TRUE(future->completed());
  const auto tensors = future->value().toTensorVector();
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_TRUE(tensors[0].is_same(t));
}

}  // namespace
