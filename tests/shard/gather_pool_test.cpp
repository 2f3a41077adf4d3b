// GatherPool ([Note: a buffer the unit's size]): the buffer fits the unit that takes it. A larger
// take grows it; a take of at most 1.25x less keeps it; a smaller one remakes it at its size, so
// that an outsized unit (the untied Llama's embedding) leaves nothing held for the blocks after
// it. A busy buffer gives a take a tensor of its own; release() frees it. The fake backend's group
// registers nothing, as Gloo's and a plain NCCL group's.

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "ddp/comm/fake_backend.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/shard/gather_pool.hpp"

namespace ddp::testing {
namespace {

comm::ProcessGroupPtr fake_world_group() {
  comm::ProcessGroup::Config config;
  config.rank = 0;
  config.size = 1;
  config.make_backend = comm::fake_backend_factory();
  return comm::ProcessGroup::create(std::move(config), c10::make_intrusive<c10d::HashStore>());
}

TEST(GatherPool, TheBufferFitsTheUnitThatTakesIt) {
  auto pg = fake_world_group();
  shard::GatherPool pool;
  shard::GatherPool::Ticket ticket;
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  const auto take = [&](int64_t numel) {
    const auto out = pool.take(numel, bf16, *pg, &ticket);
    EXPECT_TRUE(ticket.pooled);
    EXPECT_EQ(out.numel(), numel);
    pool.give_back(&ticket);
    return pool.allocated_bytes();
  };
  EXPECT_EQ(take(1000), 2000);  // a block: 1000 bf16 elements
  EXPECT_EQ(take(2400), 4800);  // the embedding, 2.4x a block: grown
  EXPECT_EQ(take(1000), 2000);  // the blocks after it: remade at their size
  EXPECT_EQ(take(800), 2000);   // a shorter layer, 1.25x less: kept
  EXPECT_EQ(take(796), 1592);   // more than 1.25x less: remade (8-aligned bytes)

  // Busy: the take gets a tensor of its own and the buffer stays.
  const auto first = pool.take(796, bf16, *pg, &ticket);
  shard::GatherPool::Ticket second_ticket;
  const auto second = pool.take(5000, bf16, *pg, &second_ticket);
  EXPECT_FALSE(second_ticket.pooled);
  EXPECT_EQ(second.numel(), 5000);
  EXPECT_EQ(pool.allocated_bytes(), 1592);
  pool.give_back(&ticket);

  pool.release();
  EXPECT_EQ(pool.allocated_bytes(), 0);
}

}  // namespace
}  // namespace ddp::testing
