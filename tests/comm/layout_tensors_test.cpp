// Tensors over layouts (comm/sharding/layout_tensors.hpp): take_local against hand-computed rows of
// a tensor whose elements are their global indices, and gather_whole giving back exactly the whole
// tensor from every rank's take_local, for 1-D layouts at world sizes 1 to 4 (sizes that do not
// divide, a rank holding nothing, packed blocks) and nested 2x2 layouts at world size 4.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/comm/sharding/layout_tensors.hpp"
#include "ddp/layout/layout.hpp"
#include "support/error_text.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using layout::Layout;
using layout::Placement;
using Shape = std::vector<int64_t>;

// Element i of the whole tensor (row-major) is i: a local tensor's values are its global indices.
torch::Tensor indices(const Shape& shape, torch::Dtype dtype = torch::kFloat) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return torch::arange(numel).reshape(shape).to(dtype);
}

torch::Tensor rows(const torch::Tensor& whole, const Shape& which) {
  return whole.index_select(0, torch::tensor(which));
}

TEST(TakeLocal, Shard0OverThreeGivesTheLastRankTheTailRow) {
  const auto whole = indices({7, 5});
  const Layout layout{{7, 5}, {3}, {Placement::shard(0, 0)}};
  // chunk = ceil(7 / 3) = 3: rows [0,3) [3,6) [6,7).
  const auto last = comm::take_local(layout, whole, {2});
  EXPECT_EQ(last.sizes().vec(), (Shape{1, 5}));
  EXPECT_TRUE(torch::equal(last, whole.narrow(0, 6, 1)));
  EXPECT_TRUE(torch::equal(comm::take_local(layout, whole, {0}), whole.narrow(0, 0, 3)));
  // A new tensor: writing it leaves the whole one alone.
  last.fill_(-1);
  EXPECT_TRUE(torch::equal(whole, indices({7, 5})));
}

TEST(TakeLocal, Shard1SplitsColumnsIntoANewContiguousTensor) {
  const auto whole = indices({5, 7}).requires_grad_();
  const Layout layout{{5, 7}, {2}, {Placement::shard(0, 1)}};
  // chunk = ceil(7 / 2) = 4: columns [0,4) [4,7).
  const auto local = comm::take_local(layout, whole, {1});
  EXPECT_TRUE(torch::equal(local, whole.detach().narrow(1, 4, 3)));
  EXPECT_TRUE(local.is_contiguous());
  EXPECT_FALSE(local.requires_grad()) << "plain data, not part of the parameter's graph";
}

TEST(TakeLocal, PackedShardHoldsOnePieceOfEveryBlock) {
  const auto whole = indices({12, 2});
  const Layout layout{{12, 2}, {2}, {Placement::shard(0, 0, /*packed=*/3)}};
  // Blocks of 4 rows (q, k, v), each split in halves: rank 1 holds rows 4b + 2, 4b + 3.
  EXPECT_TRUE(
      torch::equal(comm::take_local(layout, whole, {1}), rows(whole, {2, 3, 6, 7, 10, 11})));
  EXPECT_TRUE(torch::equal(comm::take_local(layout, whole, {0}), rows(whole, {0, 1, 4, 5, 8, 9})));
}

// The dp x tp example drawn in layout.hpp: TP splits a fused q,k,v weight, FSDP what TP left.
Layout tp_then_fsdp() {
  return Layout{{12, 4}, {2, 2}, {Placement::shard(1, 0, 3), Placement::shard(0, 0)}};
}

TEST(TakeLocal, NestedTpThenFsdpHoldsWhatLayoutHppDraws) {
  const auto whole = indices({12, 4});
  // (dp 1, tp 0): [5,6) [8,10).
  EXPECT_TRUE(
      torch::equal(comm::take_local(tp_then_fsdp(), whole, {1, 0}), rows(whole, {5, 8, 9})));
  // (dp 0, tp 1): [2,4) [6,7).
  EXPECT_TRUE(
      torch::equal(comm::take_local(tp_then_fsdp(), whole, {0, 1}), rows(whole, {2, 3, 6})));
}

TEST(TakeLocal, RankHoldingNothingGetsAnEmptyTensor) {
  // One row over 3 ranks: chunk 1, ranks 1 and 2 hold nothing.
  const auto local =
      comm::take_local(Layout{{1, 5}, {3}, {Placement::shard(0, 0)}}, indices({1, 5}), {2});
  EXPECT_EQ(local.sizes().vec(), (Shape{0, 5}));
}

TEST(TakeLocal, WholeOfTheWrongShapeIsNamed) {
  const Layout layout{{7, 5}, {3}, {Placement::shard(0, 0)}};
  EXPECT_EQ(error_of([&] {
              comm::take_local(layout, indices({5, 7}), {0});
            }),
            "ddp: take_local: the whole tensor has shape [5, 7], but the layout's shape is [7, 5] "
            "([7, 5] on mesh [3]: Shard(0) over mesh dim 0); pass the whole tensor, not a local "
            "one");
}

// Takes this rank's part of the whole tensor, gathers, and requires exactly the whole back.
void require_round_trip(comm::ProcessGroup& group, const Layout& layout,
                        torch::Dtype dtype = torch::kFloat) {
  const std::string what = "gather_whole of " + layout::describe(layout);
  const auto whole = indices(layout.shape, dtype);
  const auto local =
      comm::take_local(layout, whole, layout::coordinate_of(group.rank(), layout.mesh));
  const auto got = comm::gather_whole(layout, local, group, what);
  require(got.is_contiguous() && got.scalar_type() == dtype,
          what + ": not a contiguous " + std::string(c10::toString(dtype)));
  require(torch::equal(got, whole), what + ": not the whole tensor");
}

DDP_TEST_WORKER(gather_whole) {
  auto world = worker_process_group(std::chrono::seconds(60));
  const int64_t w = world->world_size();
  // 1-D layouts: sizes that do not divide, a rank holding nothing (rows 1), packed blocks, an
  // empty tensor (every rank skips the collective), an integer dtype.
  for (const Layout& layout : {
           Layout{{7, 5}, {w}, {Placement::shard(0, 0)}},
           Layout{{5, 7}, {w}, {Placement::shard(0, 1)}},
           Layout{{1, 5}, {w}, {Placement::shard(0, 0)}},
           Layout{{12, 2}, {w}, {Placement::shard(0, 0, 3)}},
           Layout{{0, 3}, {w}, {Placement::shard(0, 0)}},
           Layout{{7}, {w}, {Placement::shard(0, 0)}},
           Layout{{7, 5}, {w}, {}},
       }) {
    require_round_trip(*world, layout);
  }
  require_round_trip(*world, Layout{{7, 5}, {w}, {Placement::shard(0, 0)}}, torch::kLong);

  // A local tensor that is not one flat block (column-major strides) gathers the same.
  const Layout columns{{5, 7}, {w}, {Placement::shard(0, 1)}};
  const auto local =
      comm::take_local(columns, indices({5, 7}), layout::coordinate_of(world->rank(), {w}));
  const auto strided = local.t().contiguous().t();
  require(
      torch::equal(comm::gather_whole(columns, strided, *world, "strided local"), indices({5, 7})),
      "gather_whole of a column-major local tensor");
  if (w != 4) return;

  // 2x2 meshes {dp, tp}: nested, rowwise TP (Shard(1)) then dp Shard(0), a replicated dp dim.
  for (const Layout& layout : {
           tp_then_fsdp(),
           Layout{{7, 5}, {2, 2}, {Placement::shard(1, 0), Placement::shard(0, 0)}},
           Layout{{5, 7}, {2, 2}, {Placement::shard(1, 1), Placement::shard(0, 0)}},
           Layout{{7, 5}, {2, 2}, {Placement::shard(1, 0)}},
       }) {
    require_round_trip(*world, layout);
  }
  // The DeviceMesh overload gathers over the mesh's parent.
  comm::DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
  const auto whole = indices({12, 4});
  const auto mine = comm::take_local(tp_then_fsdp(), whole, mesh.coordinate());
  require(torch::equal(comm::gather_whole(tp_then_fsdp(), mine, mesh, "over a mesh"), whole),
          "gather_whole over a DeviceMesh");
}

DDP_WORKER_TEST_PER_WORLD(GatherWhole, EveryRankGetsExactlyTheWholeTensorBack, gather_whole, 1, 2,
                          3, 4);

DDP_TEST_WORKER(gather_whole_errors) {
  auto world = worker_process_group(std::chrono::seconds(60));
  const auto whole = indices({7, 5});
  const std::string group = error_of([&] {
    comm::gather_whole(Layout{{7, 5}, {2, 2}, {Placement::shard(0, 0)}}, whole, *world, "wrong");
  });
  require(group ==
              "ddp: gather_whole 'wrong': the layout's mesh [2, 2] holds 4 ranks, but the process "
              "group has 1 ([7, 5] on mesh [2, 2]: Shard(0) over mesh dim 0); the group's ranks "
              "must be the mesh's coordinates, row-major",
          "group size error: " + group);
  const std::string local = error_of([&] {
    comm::gather_whole(Layout{{7, 5}, {1}, {Placement::shard(0, 0)}}, whole.narrow(0, 0, 6), *world,
                       "short");
  });
  require(local ==
              "ddp: gather_whole 'short': rank 0 passed a local tensor of shape [6, 5], but it "
              "holds [7, 5] at coordinate [0] ([7, 5] on mesh [1]: Shard(0) over mesh dim 0)",
          "local shape error: " + local);
  comm::DeviceMesh mesh(world, {1, 1}, {"dp", "tp"});
  const std::string shape = error_of([&] {
    comm::gather_whole(Layout::replicated({7, 5}), whole, mesh, "mismatched mesh");
  });
  require(shape ==
              "ddp: gather_whole 'mismatched mesh': the layout's mesh [1] differs from the "
              "DeviceMesh's shape [1, 1] ([7, 5] on mesh [1]: replicated)",
          "mesh shape error: " + shape);
}

TEST(GatherWholeErrors, NameTheGroupSizeTheLocalShapeAndTheMesh) {
  EXPECT_WORKERS_PASS(run_workers(gather_whole_errors, 1));
}

}  // namespace
}  // namespace ddp::testing
