// Layouts (layout/layout.hpp): what a mesh coordinate holds under nested, packed and padded
// splits, checked against hand-computed intervals and comm::FlatShards; and resharding pieces,
// checked by copying simulated local tensors whose elements are their global indices.

#include "ddp/layout/layout.hpp"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "ddp/comm/flat_shards.hpp"
#include "ddp/layout/tensor_layouts.hpp"

namespace ddp::layout {

// Readable failures: gtest finds these by argument-dependent lookup.
void PrintTo(const Interval& iv, std::ostream* out) {
  *out << "[" << iv.begin << ", " << iv.end << ")";
}
void PrintTo(const Piece& p, std::ostream* out) {
  *out << "{source " << ::testing::PrintToString(p.source) << ", source_offset "
       << ::testing::PrintToString(p.source_offset) << ", dest_offset "
       << ::testing::PrintToString(p.dest_offset) << ", length "
       << ::testing::PrintToString(p.length) << "}";
}

namespace {

using Intervals = std::vector<Interval>;
using Shape = std::vector<int64_t>;

std::string error_text(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

int64_t volume(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Calls fn(index) for every index of `extents`, row-major.
void for_each_index(const Shape& extents, const std::function<void(const Shape&)>& fn) {
  if (volume(extents) == 0) return;
  Shape index(extents.size(), 0);
  while (true) {
    fn(index);
    size_t d = extents.size();
    while (d > 0 && ++index[d - 1] == extents[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

int64_t flat(const Shape& index, const Shape& shape) {
  int64_t at = 0;
  for (size_t d = 0; d < shape.size(); ++d) at = at * shape[d] + index[d];
  return at;
}

// The local tensor `coordinate` should hold under `layout`, built from held() alone: each
// element is its row-major index in the whole tensor.
std::vector<int> expected_local(const Layout& layout, const Shape& coordinate) {
  const Held h = held(layout, coordinate);
  const Shape local = local_shape(layout, coordinate);
  std::vector<int> values(volume(local));
  for_each_index(local, [&](const Shape& index) {
    Shape global;
    for (size_t d = 0; d < index.size(); ++d) {
      int64_t rest = index[d];
      for (const Interval& iv : h.dims[d]) {
        if (rest < iv.size()) {
          global.push_back(iv.begin + rest);
          break;
        }
        rest -= iv.size();
      }
    }
    values[flat(index, local)] = static_cast<int>(flat(global, layout.shape));
  });
  return values;
}

// The wanted coordinate's local tensor assembled by copying pieces() out of the saved holders'
// simulated local tensors; -1 where nothing was copied.
std::vector<int> assembled(const Layout& saved, const Layout& wanted, const Shape& coordinate) {
  const Shape local = local_shape(wanted, coordinate);
  std::vector<int> values(volume(local), -1);
  std::map<Shape, std::vector<int>> holders;
  for (const Piece& p : pieces(saved, wanted, coordinate)) {
    EXPECT_GT(volume(p.length), 0) << "no empty pieces";
    if (!holders.count(p.source)) holders[p.source] = expected_local(saved, p.source);
    const std::vector<int>& from = holders[p.source];
    const Shape from_shape = local_shape(saved, p.source);
    for_each_index(p.length, [&](const Shape& index) {
      Shape src = p.source_offset, dst = p.dest_offset;
      for (size_t d = 0; d < index.size(); ++d) {
        src[d] += index[d];
        dst[d] += index[d];
      }
      EXPECT_EQ(values[flat(dst, local)], -1) << "element copied twice";
      values[flat(dst, local)] = from[flat(src, from_shape)];
    });
  }
  return values;
}

// Every coordinate of `wanted` assembled from `saved` holds exactly what held() says it holds.
void expect_reshards(const Layout& saved, const Layout& wanted) {
  for (int64_t rank = 0; rank < volume(wanted.mesh); ++rank) {
    const Shape c = coordinate_of(rank, wanted.mesh);
    EXPECT_EQ(assembled(saved, wanted, c), expected_local(wanted, c))
        << describe(saved) << " -> " << describe(wanted) << " at rank " << rank;
  }
}

Layout rows_over(int64_t rows, int world) {
  return Layout{{rows, 5}, {world}, {Placement::shard(0, 0)}};
}

TEST(LayoutMesh, CoordinateAndRankRoundTrip) {
  for (const Shape& mesh : {Shape{1}, Shape{3}, Shape{2, 2}, Shape{2, 3}, Shape{1, 4}}) {
    for (int64_t rank = 0; rank < volume(mesh); ++rank) {
      EXPECT_EQ(rank_of(coordinate_of(rank, mesh), mesh), rank);
    }
  }
  // Row-major, the last mesh dim fastest, as comm::DeviceMesh.
  EXPECT_EQ(coordinate_of(1, {2, 3}), (Shape{0, 1}));
  EXPECT_EQ(coordinate_of(5, {2, 3}), (Shape{1, 2}));
  EXPECT_EQ(coordinate_of(3, {1, 4}), (Shape{0, 3}));
  EXPECT_EQ(error_text([] {
              coordinate_of(4, {2, 2});
            }),
            "ddp: coordinate_of: rank 4 is outside mesh [2, 2] of 4 ranks");
  EXPECT_EQ(error_text([] {
              rank_of({0, 2}, {2, 2});
            }),
            "ddp: rank_of: coordinate [0, 2] is outside mesh [2, 2]");
}

TEST(LayoutSplit, OneShardIsTheEvenSplitOfFlatShards) {
  for (int64_t rows = 0; rows <= 9; ++rows) {
    for (int world = 1; world <= 4; ++world) {
      const comm::FlatShards split{rows, world};
      const Layout layout = rows_over(rows, world);
      EXPECT_EQ(padded_local_shape(layout), (Shape{split.chunk(), 5}));
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(local_shape(layout, {r}), (Shape{split.length(r), 5}))
            << "rows " << rows << " world " << world << " rank " << r;
        const Intervals rows_held = held(layout, {r}).dims[0];
        if (split.length(r) == 0) {
          EXPECT_TRUE(rows_held.empty());
        } else {
          EXPECT_EQ(rows_held, (Intervals{{split.offset(r), split.offset(r) + split.length(r)}}));
        }
        EXPECT_EQ(held(layout, {r}).dims[1], (Intervals{{0, 5}})) << "dim 1 is not split";
      }
    }
  }
}

TEST(LayoutPieces, TheHeaderExample) {
  EXPECT_EQ(held(rows_over(7, 3), {2}).dims[0], (Intervals{{6, 7}}));
  EXPECT_EQ(held(rows_over(7, 2), {1}).dims[0], (Intervals{{4, 7}}));
  EXPECT_EQ(pieces(rows_over(7, 3), rows_over(7, 2), {1}),
            (std::vector<Piece>{{{1}, {1, 0}, {0, 0}, {2, 5}}, {{2}, {0, 0}, {2, 0}, {1, 5}}}));
}

class LayoutReshardRows : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(LayoutReshardRows, PiecesReassembleEveryRankRows) {
  const auto [saved_world, wanted_world] = GetParam();
  for (int64_t rows = 0; rows <= 9; ++rows) {
    expect_reshards(rows_over(rows, saved_world), rows_over(rows, wanted_world));
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, LayoutReshardRows,
                         ::testing::Combine(::testing::Range(1, 5), ::testing::Range(1, 5)));

TEST(LayoutHeld, PackedSplitsEachBlockOnItsOwn) {
  // A fused q,k,v weight of 3 blocks of 4 rows, tensor-parallel over 2 ranks: each rank takes
  // half of every block, as Megatron's split of a fused projection.
  const Layout qkv{{12, 2}, {2}, {Placement::shard(0, 0, 3)}};
  EXPECT_EQ(held(qkv, {0}).dims[0], (Intervals{{0, 2}, {4, 6}, {8, 10}}));
  EXPECT_EQ(held(qkv, {1}).dims[0], (Intervals{{2, 4}, {6, 8}, {10, 12}}));
  EXPECT_EQ(local_shape(qkv, {1}), (Shape{6, 2}));
  // Over one rank the blocks touch again: the whole dim, as one interval.
  EXPECT_EQ(held(Layout{{12, 2}, {1}, {Placement::shard(0, 0, 3)}}, {0}).dims[0],
            (Intervals{{0, 12}}));
}

TEST(LayoutHeld, FsdpSplitsWhatPackedTpLeft) {
  // The header's example: mesh {dp 2, tp 2}, TP's packed shard first, FSDP's shard appended.
  const Layout layout{{12, 4}, {2, 2}, {Placement::shard(1, 0, 3), Placement::shard(0, 0)}};
  EXPECT_EQ(held(layout, {0, 0}).dims[0], (Intervals{{0, 2}, {4, 5}}));
  EXPECT_EQ(held(layout, {1, 0}).dims[0], (Intervals{{5, 6}, {8, 10}}));
  EXPECT_EQ(held(layout, {0, 1}).dims[0], (Intervals{{2, 4}, {6, 7}}));
  EXPECT_EQ(held(layout, {1, 1}).dims[0], (Intervals{{7, 8}, {10, 12}}));
  for (int64_t rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(held(layout, coordinate_of(rank, layout.mesh)).dims[1], (Intervals{{0, 4}}));
    EXPECT_EQ(local_shape(layout, coordinate_of(rank, layout.mesh)), (Shape{3, 4}));
  }
  EXPECT_EQ(padded_local_shape(layout), (Shape{3, 4}));
  EXPECT_EQ(describe(layout),
            "[12, 4] on mesh [2, 2]: Shard(0, packed 3) over mesh dim 1, Shard(0) over mesh dim 0");
}

TEST(LayoutHeld, FsdpRowsOverRowwiseTpColumnsWithPadding) {
  const Layout layout{{5, 4}, {2, 2}, {Placement::shard(1, 1), Placement::shard(0, 0)}};
  // tp splits the 4 columns 2/2; dp the 5 rows 3/2 (chunk 3).
  EXPECT_EQ(held(layout, {0, 0}).dims, (std::vector<Intervals>{{{0, 3}}, {{0, 2}}}));
  EXPECT_EQ(held(layout, {0, 1}).dims, (std::vector<Intervals>{{{0, 3}}, {{2, 4}}}));
  EXPECT_EQ(held(layout, {1, 0}).dims, (std::vector<Intervals>{{{3, 5}}, {{0, 2}}}));
  EXPECT_EQ(held(layout, {1, 1}).dims, (std::vector<Intervals>{{{3, 5}}, {{2, 4}}}));
  EXPECT_EQ(local_shape(layout, {1, 1}), (Shape{2, 2}));
  EXPECT_EQ(padded_local_shape(layout), (Shape{3, 2}));
}

TEST(LayoutHeld, UnevenPackedTpLeavesFsdpUnevenPieces) {
  // 9 rows = 3 blocks of 3; tp chunk 2 gives tp 0 two rows of each block (6), tp 1 one (3);
  // dp then splits 6 as 3/3 and 3 as 2/1. Storage pads to tp's 6 and dp's 3.
  const Layout layout{{9, 5}, {2, 2}, {Placement::shard(1, 0, 3), Placement::shard(0, 0)}};
  EXPECT_EQ(held(layout, {0, 0}).dims[0], (Intervals{{0, 2}, {3, 4}}));
  EXPECT_EQ(held(layout, {1, 0}).dims[0], (Intervals{{4, 5}, {6, 8}}));
  EXPECT_EQ(held(layout, {0, 1}).dims[0], (Intervals{{2, 3}, {5, 6}}));
  EXPECT_EQ(held(layout, {1, 1}).dims[0], (Intervals{{8, 9}}));
  EXPECT_EQ(padded_local_shape(layout), (Shape{3, 5}));
  EXPECT_EQ(local_shape(layout, {0, 0}), padded_local_shape(layout)) << "coordinate 0 is full";
}

// Nested dp x tp layouts on mesh {2, 2}, some with a replicated mesh dim.
std::vector<Layout> nested_layouts() {
  return {
      {{12, 6}, {2, 2}, {Placement::shard(1, 0, 3), Placement::shard(0, 0)}},
      {{9, 5}, {2, 2}, {Placement::shard(1, 0, 3), Placement::shard(0, 0)}},
      {{5, 4}, {2, 2}, {Placement::shard(1, 1), Placement::shard(0, 0)}},
      {{7, 3}, {2, 2}, {Placement::shard(1, 0), Placement::shard(0, 0)}},
      {{6, 5}, {2, 2}, {Placement::shard(0, 0), Placement::shard(1, 1)}},
      {{5, 3}, {2, 2}, {Placement::shard(1, 0)}},
      {{3, 2}, {2, 2}, {Placement::replicate(0), Placement::shard(1, 1)}},
  };
}

class LayoutRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(LayoutRoundTrip, NestedToSimpleAndBack) {
  const Layout nested = nested_layouts()[GetParam()];
  const Shape& shape = nested.shape;
  const std::vector<Layout> simple = {
      Layout::replicated(shape),
      {shape, {1, 2}, {Placement::shard(1, 1)}},
      {shape, {3}, {Placement::shard(0, 0)}},
  };
  for (const Layout& other : simple) {
    expect_reshards(nested, other);
    expect_reshards(other, nested);
  }
  for (const Layout& other : nested_layouts()) {
    if (other.shape == shape) expect_reshards(other, nested);
  }
}

TEST_P(LayoutRoundTrip, SameLayoutIsOneWholePieceFromTheHolder) {
  const Layout layout = nested_layouts()[GetParam()];
  std::vector<bool> sharded(layout.mesh.size(), false);
  for (const Placement& p : layout.placements)
    sharded[p.mesh_dim] = p.kind == Placement::Kind::kShard;
  for (int64_t rank = 0; rank < volume(layout.mesh); ++rank) {
    const Shape c = coordinate_of(rank, layout.mesh);
    const Shape local = local_shape(layout, c);
    if (volume(local) == 0) {
      EXPECT_TRUE(pieces(layout, layout, c).empty());
      continue;
    }
    // A replicated mesh dim is read at coordinate 0: that holder holds the same elements.
    Shape holder = c;
    for (size_t m = 0; m < holder.size(); ++m) holder[m] = sharded[m] ? holder[m] : 0;
    EXPECT_EQ(pieces(layout, layout, c),
              (std::vector<Piece>{{holder, Shape(local.size(), 0), Shape(local.size(), 0), local}}))
        << describe(layout) << " at rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Nested, LayoutRoundTrip,
                         ::testing::Range(0, static_cast<int>(nested_layouts().size())));

TEST(LayoutPieces, AReplicatedSaveIsReadFromOneCopy) {
  const Layout saved{{5, 3}, {3, 2}, {Placement::shard(1, 0)}};  // 3 replicas of a tp split
  for (const Piece& p : pieces(saved, Layout::replicated({5, 3}), {0})) {
    EXPECT_EQ(p.source[0], 0);
  }
  EXPECT_EQ(pieces(Layout::replicated({}), Layout::replicated({}), {0}),
            (std::vector<Piece>{{{0}, {}, {}, {}}}))
      << "a scalar is one empty-box piece";
}

TEST(LayoutPieces, DifferentShapesAreAnError) {
  EXPECT_EQ(error_text([] {
              pieces(rows_over(7, 2), Layout::replicated({7, 4}), {0});
            }),
            "ddp: pieces: the saved shape [7, 5] and the wanted shape [7, 4] differ; a layout "
            "change moves elements between ranks, it cannot reshape");
}

TEST(LayoutValidate, ErrorsNameWhatIsWrong) {
  EXPECT_EQ(error_text([] {
              validate({{7, 5}, {2}, {Placement::shard(0, 2)}});
            }),
            "ddp: layout [7, 5] on mesh [2]: Shard(2) over mesh dim 0: placement 0 (Shard(2) over "
            "mesh dim 0) shards tensor dim 2, but the tensor has 2 dims");
  EXPECT_EQ(error_text([] {
              validate({{7, 5}, {2, 2}, {Placement::shard(1, 0), Placement::shard(1, 1)}});
            }),
            "ddp: layout [7, 5] on mesh [2, 2]: Shard(0) over mesh dim 1, Shard(1) over mesh dim "
            "1: mesh dim 1 is listed twice (placements 0 and 1); each mesh dim splits the tensor "
            "at most once");
  EXPECT_EQ(error_text([] {
              validate({{7, 5}, {2}, {Placement::shard(0, 0, 3)}});
            }),
            "ddp: layout [7, 5] on mesh [2]: Shard(0, packed 3) over mesh dim 0: placement 0 "
            "(Shard(0, packed 3) over mesh dim 0) splits tensor dim 0 into 3 equal blocks, but "
            "coordinate [0] holds 7 elements there, not a multiple of 3");
  // 7 rows over dp 2 leave 4 and 3: only coordinate [1, 0] cannot pack 2 blocks.
  EXPECT_EQ(error_text([] {
              validate({{7}, {2, 2}, {Placement::shard(0, 0), Placement::shard(1, 0, 2)}});
            }),
            "ddp: layout [7] on mesh [2, 2]: Shard(0) over mesh dim 0, Shard(0, packed 2) over "
            "mesh dim 1: placement 1 (Shard(0, packed 2) over mesh dim 1) splits tensor dim 0 "
            "into 2 equal blocks, but coordinate [1, 0] holds 3 elements there, not a multiple "
            "of 2");
  EXPECT_EQ(error_text([] {
              validate({{7}, {2, 0}, {}});
            }),
            "ddp: layout: mesh [2, 0] has size 0 on mesh dim 1; every mesh dim needs at least 1 "
            "rank");
  EXPECT_EQ(error_text([] {
              validate({{7}, {2}, {Placement::shard(1, 0)}});
            }),
            "ddp: layout [7] on mesh [2]: Shard(0) over mesh dim 1: placement 0 (Shard(0) over "
            "mesh dim 1) names mesh dim 1, but the mesh has 1 dims");
  EXPECT_EQ(error_text([] {
              validate({{7}, {2}, {Placement::shard(0, 0, 0)}});
            }),
            "ddp: layout [7] on mesh [2]: Shard(0, packed 0) over mesh dim 0: placement 0 "
            "(Shard(0, packed 0) over mesh dim 0) has packed 0; packed counts equal blocks side "
            "by side, at least 1");
  EXPECT_EQ(error_text([] { validate(Layout::replicated({7, 5})); }), "");
  EXPECT_EQ(describe(Layout::replicated({7, 5})), "[7, 5] on mesh [1]: replicated");
}

// FULLY_SHARD over tensor parallelism: the sharded runtime sees the tp-local [6, 4] and splits it
// over dp; nest() appends its placement to TP's, over mesh {dp, tp}: the layout drawn in
// layout.hpp.
TEST(LayoutNest, FullyShardOverTpAppendsItsPlacement) {
  const Layout tp{{12, 4}, {2}, {Placement::shard(0, 0, 3)}};
  const Layout fsdp{{6, 4}, {2}, {Placement::shard(0, 0)}};
  const Layout both = nest(tp, fsdp);
  EXPECT_EQ(both.mesh, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(both.placements,
            (std::vector<Placement>{Placement::shard(1, 0, 3), Placement::shard(0, 0)}));
  EXPECT_EQ(held(both, {1, 0}).dims[0], (std::vector<Interval>{{5, 6}, {8, 10}}));
  EXPECT_EQ(error_text([&] {
              nest(tp, Layout{{12, 4}, {2}, {Placement::shard(0, 0)}});
            }),
            "ddp: layout nest: the outer layout is over shape [12, 4] but the inner layout "
            "([12, 4] on mesh [2]: Shard(0, packed 3) over mesh dim 0) leaves local tensors of "
            "[6, 4]");
  // Rows 5 over tp 2 leave 3 and 2 rows: no one outer split fits both.
  EXPECT_EQ(error_text([] {
              nest(Layout{{5, 4}, {2}, {Placement::shard(0, 0)}},
                   Layout{{3, 4}, {2}, {Placement::shard(0, 0)}});
            }),
            "ddp: layout nest: inner coordinate [1] holds [2, 4], not the [3, 4] the outer layout "
            "splits ([5, 4] on mesh [2]: Shard(0) over mesh dim 0)");
}

// What wrappers register: FULLY_SHARD's layouts nested on TP's name by name; a name only one side
// splits is whole on the other's dims; an unregistered name is whole everywhere.
TEST(TensorLayouts, NestNameByNameAndUnregisteredNamesAreWhole) {
  TensorLayouts tp;
  tp.mesh = {2};
  tp.coordinate = {1};
  tp.by_name["w"] = Layout{{4, 3}, {2}, {Placement::shard(0, 0)}};
  tp.by_name["b"] = Layout{{6}, {2}, {}};
  TensorLayouts fsdp;
  fsdp.mesh = {3};
  fsdp.coordinate = {2};
  fsdp.by_name["w"] = Layout{{2, 3}, {3}, {Placement::shard(0, 0)}};
  fsdp.by_name["x"] = Layout{{5}, {3}, {Placement::shard(0, 0)}};
  const TensorLayouts both = nest(tp, fsdp);
  EXPECT_EQ(both.mesh, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(both.coordinate, (std::vector<int64_t>{2, 1}));
  ASSERT_EQ(both.by_name.size(), 3u);
  EXPECT_EQ(describe(both.by_name.at("w")), describe(nest(tp.by_name["w"], fsdp.by_name["w"])));
  EXPECT_EQ(describe(both.by_name.at("w")),
            "[4, 3] on mesh [3, 2]: Shard(0) over mesh dim 1, Shard(0) over mesh dim 0");
  EXPECT_EQ(describe(both.by_name.at("x")), "[5] on mesh [3, 2]: Shard(0) over mesh dim 0");
  EXPECT_EQ(describe(both.by_name.at("b")), "[6] on mesh [3, 2]: replicated");
  // Coordinate (2, 1) of "w": tp rank 1 holds rows [2, 4), fsdp rank 2 of its 2 rows nothing.
  EXPECT_EQ(local_shape(both.by_name.at("w"), both.coordinate), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(describe(both.of("unknown", {7, 2})), "[7, 2] on mesh [3, 2]: replicated");
}

}  // namespace
}  // namespace ddp::layout
