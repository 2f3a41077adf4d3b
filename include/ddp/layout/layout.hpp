#pragma once
// Layout: which part of the whole tensor a mesh coordinate holds, described once (a small
// analogue of DTensor's placements). Pure arithmetic on shapes: no tensors, no process groups.
// Tensor parallelism, FSDP and sharded checkpoints all answer "what does coordinate c hold" and
// "where do I copy it from" with these functions instead of each keeping its own row rule.
//
// A layout is the global shape, the mesh sizes, and placements applied IN LIST ORDER: the first
// splits the whole tensor, each next one splits the local piece the previous ones left, and a
// mesh dim with no placement is replicated. Each Shard uses the even split rule of
// comm/flat_shards.hpp ([Note: the even split rule]), so the last ranks may hold less or nothing.
// Since splits nest, a coordinate holds on each tensor dim a LIST of global intervals, in the
// order they sit in its local tensor:
//
//   shape [12, 4], mesh {2 (dp), 2 (tp)}, placements
//     {Shard(dim 0, packed 3) over mesh dim 1,    TP: a fused q,k,v weight, 3 blocks of 4 rows
//      Shard(dim 0) over mesh dim 0}              FSDP: splits what TP left
//
//   global rows   q: 0 1 2 3 | k: 4 5 6 7 | v: 8 9 10 11
//   after TP      tp 0: [0,2) [4,6) [8,10)          (6 local rows)
//                 tp 1: [2,4) [6,8) [10,12)
//   after FSDP    (dp 0, tp 0): [0,2) [4,5)         local rows 0..2 of tp 0
//                 (dp 1, tp 0): [5,6) [8,10)        local rows 3..5 of tp 0
//                 (dp 0, tp 1): [2,4) [6,7)
//                 (dp 1, tp 1): [7,8) [10,12)
//   every coordinate holds all of dim 1: [0,4)
//
// Resharding (a checkpoint saved under one layout, loaded under another) copies `pieces`: boxes
// of a saved holder's local tensor into the wanted coordinate's local tensor.
//
//   rows 7 x 5, saved Shard(0) at world 3: [0,3) [3,6) [6,7); wanted world 2, rank 1 holds [4,7)
//     piece {source {1}, source_offset {1, 0}, dest_offset {0, 0}, length {2, 5}}   rows 4, 5
//     piece {source {2}, source_offset {0, 0}, dest_offset {2, 0}, length {1, 5}}   row 6

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::layout {

// The coordinate of `rank` in a mesh of sizes `mesh`, row-major (the last mesh dim varies
// fastest), as comm::DeviceMesh lays out its ranks: mesh {2, 2} puts rank 3 at {1, 1}.
std::vector<int64_t> coordinate_of(int64_t rank, const std::vector<int64_t>& mesh);
// The inverse: rank = c0 * s1 * s2 ... + c1 * s2 ... + ... + c_last.
int64_t rank_of(const std::vector<int64_t>& coordinate, const std::vector<int64_t>& mesh);

// How one mesh dim splits the tensor: not at all (Replicate), or along tensor dim `dim`.
struct Placement {
  enum class Kind { kReplicate, kShard };

  int mesh_dim = 0;
  Kind kind = Kind::kReplicate;
  // Shard only: the tensor dim split over the ranks of `mesh_dim`.
  int64_t dim = 0;
  // Shard only: the tensor dim is `packed` equal blocks side by side (a fused q,k,v projection
  // is 3), and each block is split on its own, so a rank holds one piece of every block,
  // concatenated in block order. 1 (the default) is the plain split. Must divide the extent it
  // splits, or the blocks would not be equal.
  int64_t packed = 1;

  static Placement replicate(int mesh_dim);
  static Placement shard(int mesh_dim, int64_t dim, int64_t packed = 1);

  // dim and packed count only for Shard: two Replicates of one mesh dim are equal.
  bool operator==(const Placement& other) const;
  bool operator!=(const Placement& other) const { return !(*this == other); }
};

struct Layout {
  std::vector<int64_t> shape;  // the global, whole tensor's shape
  std::vector<int64_t> mesh;   // ranks per mesh dim, each >= 1; {1} for one rank
  // Applied in list order (each splits what the previous ones left); a mesh dim appears at most
  // once, and one that appears nowhere is replicated.
  std::vector<Placement> placements;

  // The whole tensor on one rank: mesh {1}, no placements.
  static Layout replicated(std::vector<int64_t> shape);
};

// A layout over a whole tensor whose local pieces are split again by another runtime: `outer`
// describes how that runtime splits the local tensor `inner` leaves (outer.shape is
// padded_local_shape(inner), the same on every inner coordinate, else c10::Error), e.g. FULLY_SHARD
// over the dp group on top of tensor parallelism over the tp group. The result is over the mesh
// outer.mesh ++ inner.mesh (the outer runtime's dims first, as DeviceMesh {"dp", "tp"} orders
// them), with inner's placements (their mesh dims moved past outer's) followed by outer's:
// "FULLY_SHARD over TP appends a placement".
Layout nest(const Layout& inner, const Layout& outer);

// "[7, 5] on mesh [2, 2]: Shard(0) over mesh dim 1, Shard(0) over mesh dim 0"; a packed shard
// reads "Shard(0, packed 3)", no placements read "replicated". For error messages; it accepts
// invalid layouts too.
std::string describe(const Layout& layout);

// Throws c10::Error naming what is wrong: a mesh without dims or with a size < 1, a negative
// tensor size, a mesh dim out of range or listed twice, a tensor dim out of range, packed < 1,
// or packed not dividing the extent it splits at some coordinate.
void validate(const Layout& layout);

// Global elements [begin, end) of one tensor dim.
struct Interval {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Interval& other) const { return begin == other.begin && end == other.end; }
};

// What one coordinate holds: per tensor dim, the global intervals in the order they sit in its
// local tensor (the local tensor is their cartesian product). A dim nothing splits holds
// [0, size). Empty intervals are dropped, and intervals that touch ([0,2) then [2,4)) are merged,
// so the list is the same however the holding came about: a coordinate holding nothing on a dim
// has an empty list there.
struct Held {
  std::vector<std::vector<Interval>> dims;
};

Held held(const Layout& layout, const std::vector<int64_t>& coordinate);

// The coordinate's real local tensor: per dim, the sum of its held intervals (0 where it holds
// nothing), without the padding the even split rule implies.
std::vector<int64_t> local_shape(const Layout& layout, const std::vector<int64_t>& coordinate);

// The local shape every coordinate's storage has when each Shard pads its ranks to the full
// chunk (ceil(extent / ranks) per packed block): the same on every coordinate, which is what
// sharded flat buffers and the collectives over them need. Coordinate 0 on every mesh dim
// always holds exactly this much.
std::vector<int64_t> padded_local_shape(const Layout& layout);

// One box to copy: elements [source_offset, source_offset + length) of the local tensor of the
// saved layout's coordinate `source` go to [dest_offset, dest_offset + length) of the wanted
// coordinate's local tensor (offsets and lengths per tensor dim, in LOCAL indices).
struct Piece {
  std::vector<int64_t> source;  // a coordinate in the saved layout's mesh
  std::vector<int64_t> source_offset;
  std::vector<int64_t> dest_offset;
  std::vector<int64_t> length;
  bool operator==(const Piece& other) const {
    return source == other.source && source_offset == other.source_offset &&
           dest_offset == other.dest_offset && length == other.length;
  }
};

// The pieces that fill the local tensor of `wanted_coordinate` under `wanted` completely from
// the local tensors of the holders under `saved`. Both layouts must describe the same shape.
// Replicated saved mesh dims are read at coordinate 0 only, so the holders used partition the
// tensor and each element is copied exactly once. No empty pieces; ordered by source coordinate
// (row-major), then by position in the wanted local tensor (row-major); boxes contiguous in both
// local tensors are merged. Throws c10::Error naming the first element nobody holds if the
// pieces do not cover the wanted local tensor (a bug: valid layouts always cover).
std::vector<Piece> pieces(const Layout& saved, const Layout& wanted,
                          const std::vector<int64_t>& wanted_coordinate);

}  // namespace ddp::layout
