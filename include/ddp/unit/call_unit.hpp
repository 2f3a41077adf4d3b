#pragma once
// What a model's forward writes around each block it wants wrapped (a unit of a sharded wrapper, a
// module a tensor-parallel plan splits): module.forward(x) through run_unit (a plain forward when
// no runtime has the module as a unit), and, when asked, with its activations recomputed in
// backward (activation_checkpoint). The checkpoint is inside the unit, so the unit is gathered
// again (by the node on its output) before the recompute reads its parameters.
//
//   for (auto& block : blocks_) x = ddp::call_unit(*block, x);          // block: a holder
//   h = ddp::call_unit(*fc1, x, /*checkpoint=*/true);

#include <torch/types.h>

#include "ddp/unit/activation_checkpoint.hpp"
#include "ddp/unit/unit_scope.hpp"

namespace ddp::unit {

// `module`: the Impl (a holder's *holder) whose forward takes and returns one tensor.
template <typename Module>
torch::Tensor call_unit(Module& module, const torch::Tensor& x, bool checkpoint = false) {
  const auto forward = [&module](const torch::Tensor& in) { return module.forward(in); };
  return run_unit(
      module,
      [&](const torch::Tensor& in) {
        return checkpoint ? activation_checkpoint(module, forward, in) : forward(in);
      },
      x);
}

}  // namespace ddp::unit

namespace ddp {
using unit::call_unit;
}  // namespace ddp
