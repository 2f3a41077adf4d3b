#pragma once
// How the zoo runs a block: as a unit of a sharded wrapper (unit::run_unit; plain forward when
// there is none) and, when asked, with its activations recomputed in backward
// (unit::activation_checkpoint:
// --fsdp-checkpoint). The checkpoint is inside the unit, so the unit is gathered again (by the
// node on its output) before the recompute reads its parameters.

#include <torch/types.h>

#include "ddp/unit/activation_checkpoint.hpp"
#include "ddp/unit/unit_scope.hpp"

namespace ddp::models {

template <typename Block>
torch::Tensor call_block(Block& block, const torch::Tensor& x, bool checkpoint) {
  const auto forward = [&block](const torch::Tensor& in) { return block.forward(in); };
  return unit::run_unit(
      block,
      [&](const torch::Tensor& in) {
        return checkpoint ? unit::activation_checkpoint(block, forward, in) : forward(in);
      },
      x);
}

}  // namespace ddp::models
