#pragma once
// EvenSplit: how `numel` elements (a flat tensor, or one tensor dim) are split over `world` ranks.
// Pure arithmetic, the one split rule of the house: the layouts' Shard placements
// (layout/layout.hpp), the collectives' flat shards (comm/flat_shards.hpp) and whoever lays out
// buffers for them (sharding pads its flat parameters to a multiple of the group size so that
// every collective takes the even path).
//
// [Note: the even split rule] chunk = ceil(numel / world); rank r owns the elements
// [r * chunk, min(numel, (r + 1) * chunk)). So the first shards are full and the last ones are
// shorter or EMPTY: numel 7 over 3 ranks gives 3, 3, 1; numel 1 over 3 gives 1, 0, 0; numel 0
// gives 0, 0, 0. This is torch.chunk's rule and FSDP2's dim-0 padding rule, so a flat buffer
// laid out for one fits the other. numel == world * chunk is the "even" case: no padding.

#include <algorithm>
#include <cstdint>

namespace ddp::layout {

struct EvenSplit {
  int64_t numel = 0;  // elements of the whole
  int64_t world = 1;  // ranks it is split over, >= 1

  // Elements per full shard: ceil(numel / world).
  constexpr int64_t chunk() const { return (numel + world - 1) / world; }
  // Where rank r's shard starts (numel for an empty tail shard).
  constexpr int64_t offset(int64_t rank) const { return std::min(numel, rank * chunk()); }
  // Elements rank r owns: chunk(), fewer for the last non-empty shard, 0 after it.
  constexpr int64_t length(int64_t rank) const {
    return std::min(numel, (rank + 1) * chunk()) - offset(rank);
  }
  // world * chunk(): the size the collectives pad to when the split is uneven.
  constexpr int64_t padded_numel() const { return world * chunk(); }
  // Every shard has chunk() elements: the collectives need no padding.
  constexpr bool even() const { return padded_numel() == numel; }
};

}  // namespace ddp::layout
