#include "ddp/shard/row_pieces.hpp"

#include <c10/util/Exception.h>

#include <algorithm>

#include "ddp/comm/flat_shards.hpp"

namespace ddp::shard {

RowRange rows_held(const ParamShard& p, int rank, int world) {
  if (p.placement == Placement::kReplicate) return {0, p.rows};
  const comm::FlatShards split{p.rows, world};
  return {split.offset(rank), split.offset(rank) + split.length(rank)};
}

std::vector<RowPiece> row_pieces(const std::vector<RowRange>& held, RowRange wanted) {
  TORCH_CHECK(wanted.begin <= wanted.end, "ddp: row_pieces: wanted rows [", wanted.begin, ", ",
              wanted.end, ") are reversed");
  std::vector<RowPiece> pieces;
  int64_t row = wanted.begin;
  // Each round takes the lowest holder of `row` and as many rows as it has from there: shards
  // are contiguous, so a wanted range needs at most (its rows / chunk + 2) rounds.
  while (row < wanted.end) {
    int best = -1;
    for (size_t q = 0; q < held.size(); ++q) {
      if (held[q].begin <= row && row < held[q].end) {
        best = static_cast<int>(q);
        break;
      }
    }
    TORCH_CHECK(best >= 0, "ddp: row ", row, " of wanted rows [", wanted.begin, ", ", wanted.end,
                ") is held by none of the ", held.size(), " holders");
    const int64_t rows = std::min(wanted.end, held[best].end) - row;
    pieces.push_back({best, row - held[best].begin, row - wanted.begin, rows});
    row += rows;
  }
  return pieces;
}

}  // namespace ddp::shard
