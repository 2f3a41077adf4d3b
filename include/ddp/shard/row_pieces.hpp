#pragma once
// Row arithmetic for resharding a dim-0-sharded tensor: which global rows each rank holds between
// steps, and from which holders a wanted row range is assembled. Pure (no tensors, no files): a
// sharded checkpoint written at one world size is read at another by copying these pieces
// (io/sharded_checkpoint.hpp), and the unit test checks every (saved world, loaded world, rows).
//
//   rows 7, saved at world 3 (chunk 3):   rank 0 [0, 3)  rank 1 [3, 6)  rank 2 [6, 7)
//   loaded at world 2 (chunk 4), rank 1 wants [4, 7):
//     piece {source 1, source_row 1, dest_row 0, rows 2}   global rows 4, 5
//     piece {source 2, source_row 0, dest_row 2, rows 1}   global row 6

#include <cstdint>
#include <vector>

#include "ddp/shard/shard_plan.hpp"

namespace ddp::shard {

// Global rows [begin, end) of a tensor's dim 0.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const RowRange& other) const { return begin == other.begin && end == other.end; }
};

// The global rows rank `rank` holds of parameter `p` under a plan of `world` ranks: its real rows
// [offset, offset + rows_on(rank)) when sharded (the even split rule; empty past the last row),
// every row [0, rows) when replicated.
RowRange rows_held(const ParamShard& p, int rank, int world);

// Copy `rows` rows starting at row `source_row` of holder `source`'s rows into the wanted range
// at row `dest_row` (both relative to the start of their range).
struct RowPiece {
  int source = 0;
  int64_t source_row = 0;
  int64_t dest_row = 0;
  int64_t rows = 0;
  bool operator==(const RowPiece& other) const {
    return source == other.source && source_row == other.source_row && dest_row == other.dest_row &&
           rows == other.rows;
  }
};

// The pieces that make up `wanted` from `held` (held[q]: the rows holder q has), in row order,
// without empty pieces; held ranges may overlap (replicated holders), the lowest holder of a row
// is used. Throws c10::Error naming the first row no holder has.
std::vector<RowPiece> row_pieces(const std::vector<RowRange>& held, RowRange wanted);

}  // namespace ddp::shard
