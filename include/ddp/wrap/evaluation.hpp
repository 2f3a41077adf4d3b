#pragma once
// Evaluation: the scope of an evaluation of a wrapped model, the same for every style. While it
// lives the module is in eval mode under torch::NoGradGuard, rank 0's buffers are every rank's
// (when the style's broadcast_buffers is set), and under the sharded styles every unit's
// parameters are gathered (FSDP2's unshard of every unit), so that the module itself
// (`net->forward(x)`) and the wrapper (`model(x)`, which then communicates nothing) both compute
// with the whole parameters. At its end the shards are back and the module's mode is restored.
//
//   {
//     auto evaluation = model.evaluation();  // collective: every rank of the group
//     loss_sum += criterion(net->forward(x), y).item<double>();
//   }
//   auto [sum, count] = ddp::reduce_metric(*group, loss_sum, samples);  // metric_reduction.hpp
//
// Construction and destruction are collective under the sharded styles (the gathers) and with
// broadcast_buffers (the broadcast): every rank makes them, between steps. The gathered model must
// fit one device; a larger one is evaluated through the wrapper's own forward on every rank
// (under NoGradGuard: a unit at a time).

#include <torch/csrc/autograd/grad_mode.h>

#include "ddp/wrap/wrapped_model.hpp"

namespace ddp::wrap {

class Evaluation {
 public:
  explicit Evaluation(WrappedModel& model);
  ~Evaluation();
  Evaluation(const Evaluation&) = delete;
  Evaluation& operator=(const Evaluation&) = delete;

 private:
  WrappedModel& model_;
  torch::NoGradGuard no_grad_;  // first: the gathers and the forwards below record no graph
  bool was_training_;
};

}  // namespace ddp::wrap
