#pragma once
// The checkpoint state most checkpoint tests save and resume: a model, its optimizer and how the
// wrappers split it (io::TrainingState; the step and the data position start at 0, a load sets
// them).

#include <optional>

#include "ddp/comm/sharding/sharding.hpp"
#include "ddp/io/checkpoint.hpp"

namespace ddp::testing {

inline io::TrainingState training_state(torch::nn::Module* model,
                                        torch::optim::Optimizer* optimizer,
                                        std::optional<comm::Sharding> sharding = std::nullopt) {
  io::TrainingState state;
  state.model = model;
  state.optimizer = optimizer;
  state.sharding = std::move(sharding);
  return state;
}

}  // namespace ddp::testing
