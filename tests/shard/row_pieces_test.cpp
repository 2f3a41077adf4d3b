// Row arithmetic of resharding (shard/row_pieces.hpp): every (saved world, loaded world, rows)
// up to world 4, uneven rows, fewer rows than ranks, and none.

#include "ddp/shard/row_pieces.hpp"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/error_text.hpp"

namespace ddp::shard {
namespace {

ParamShard sharded(int64_t rows) {
  ParamShard p;
  p.placement = Placement::kShard;
  p.rows = rows;
  p.row_numel = 1;
  return p;
}

std::vector<RowRange> held_by(const ParamShard& p, int world) {
  std::vector<RowRange> held;
  for (int q = 0; q < world; ++q) held.push_back(rows_held(p, q, world));
  return held;
}

TEST(RowPieces, TheHeaderExample) {
  const auto held = held_by(sharded(7), 3);
  EXPECT_EQ(held, (std::vector<RowRange>{{0, 3}, {3, 6}, {6, 7}}));
  EXPECT_EQ(rows_held(sharded(7), 1, 2), (RowRange{4, 7}));
  EXPECT_EQ(row_pieces(held, {4, 7}), (std::vector<RowPiece>{{1, 1, 0, 2}, {2, 0, 2, 1}}));
}

TEST(RowPieces, FewerRowsThanRanksLeavesTheLastOnesEmpty) {
  EXPECT_EQ(held_by(sharded(2), 3), (std::vector<RowRange>{{0, 1}, {1, 2}, {2, 2}}));
  EXPECT_EQ(held_by(sharded(1), 3), (std::vector<RowRange>{{0, 1}, {1, 1}, {1, 1}}));
  EXPECT_TRUE(row_pieces(held_by(sharded(2), 3), {2, 2}).empty());
}

TEST(RowPieces, ReplicatedHoldsEveryRowAndTheFirstHolderIsUsed) {
  ParamShard p = sharded(5);
  p.placement = Placement::kReplicate;
  EXPECT_EQ(rows_held(p, 2, 3), (RowRange{0, 5}));
  EXPECT_EQ(row_pieces(held_by(p, 3), {1, 4}), (std::vector<RowPiece>{{0, 1, 0, 3}}));
}

TEST(RowPieces, ARowNobodyHoldsIsNamed) {
  EXPECT_EQ(testing::error_of([] {
              row_pieces({{0, 3}, {4, 6}}, {2, 5});
            }),
            "ddp: row 3 of wanted rows [2, 5) is held by none of the 2 holders");
}

class RowPiecesWorlds : public ::testing::TestWithParam<std::tuple<int, int>> {};

// For every rank of the loading world: the pieces tile its rows in order, each piece lies inside
// its holder's rows, and global row g of the holder lands on global row g of the wanted range.
TEST_P(RowPiecesWorlds, PiecesTileEveryRankRowsFromTheSavedShards) {
  const auto [saved_world, loaded_world] = GetParam();
  for (int64_t rows : {0, 1, 2, 5, 7, 12}) {
    const ParamShard p = sharded(rows);
    const auto held = held_by(p, saved_world);
    int64_t covered = 0;
    for (const RowRange& h : held) {
      EXPECT_EQ(h.begin, covered) << "saved shards tile [0, rows): rows " << rows;
      covered = h.end;
    }
    EXPECT_EQ(covered, rows);
    for (int r = 0; r < loaded_world; ++r) {
      const RowRange wanted = rows_held(p, r, loaded_world);
      int64_t next = 0;
      for (const RowPiece& piece : row_pieces(held, wanted)) {
        ASSERT_GE(piece.source, 0);
        ASSERT_LT(piece.source, saved_world);
        const RowRange& from = held[piece.source];
        EXPECT_GT(piece.rows, 0);
        EXPECT_EQ(piece.dest_row, next) << "rows " << rows << " rank " << r;
        EXPECT_LE(piece.source_row + piece.rows, from.size());
        EXPECT_EQ(from.begin + piece.source_row, wanted.begin + piece.dest_row);
        next += piece.rows;
      }
      EXPECT_EQ(next, wanted.size()) << "rows " << rows << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SavedLoaded, RowPiecesWorlds,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const auto& info) {
                           return "saved" + std::to_string(std::get<0>(info.param)) + "_loaded" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ddp::shard
