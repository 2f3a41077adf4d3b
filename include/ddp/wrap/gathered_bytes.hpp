#pragma once
// GatheredBytes: what a wrapped model's step holds beyond its parameters' shards, by owner, in
// bytes: the sharded styles' gathered units and collective buffers (shard/unit_schedule.hpp
// counts them); zero for a wrapper that gathers nothing (DDP).

#include <cstdint>

namespace ddp::wrap {

struct GatheredBytes {
  int64_t full_params = 0;    // units' full parameter buffers with memory
  int64_t gather_output = 0;  // all-gather outputs: the gather pool's buffer and any of their own
  int64_t reduce_input = 0;   // reduce-scatter inputs alive
};

}  // namespace ddp::wrap
