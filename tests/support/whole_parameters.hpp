#pragma once
// A wrapped model's parameters, whole, by name, through the one export path every user has
// (io::whole_state over the model's sharding: every style, hybrid and tensor parallel meshes):
// what a test compares with its oracle. Collective over the sharding's group; between steps.

#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/sharding/sharding.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/wrap/wrapped_model.hpp"

namespace ddp::testing {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// In `module`'s named_parameters() order (a tied parameter under each of its names), on the CPU.
inline NamedTensors whole_parameters(const torch::nn::Module& module,
                                     const comm::Sharding& sharding) {
  const io::TensorMap whole = io::whole_state(module, sharding);
  NamedTensors out;
  for (const auto& item : module.named_parameters()) {
    out.emplace_back(item.key(), whole.at(item.key()));
  }
  return out;
}

// The same for the module a wrapper holds, by the wrapper's own sharding.
inline NamedTensors whole_parameters(const wrap::WrappedModel& model) {
  return whole_parameters(*model.module_ptr(), model.sharding());
}

}  // namespace ddp::testing
