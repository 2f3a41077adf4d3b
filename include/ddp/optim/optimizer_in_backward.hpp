#pragma once
// OptimizerInBackward: steps each parameter's own optimizer as soon as its bucket has been reduced
// and written back, inside backward, while later buckets are still on the wire. A listener on the
// reducer's "bucket finished" event that asks for early finishes (gradient_events.hpp).
//
// Why it is correct: a parameter's gradient is ready only after every use of the parameter in the
// graph was differentiated, so no later backward node reads its value; updating it in place
// during the rest of backward changes nothing backward computes.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "ddp/gradients/gradient_events.hpp"

namespace torch::optim {
class Optimizer;
}

namespace ddp::optim {

// Makes the optimizer that owns one parameter.
using ParamOptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(const at::Tensor& param)>;

class OptimizerInBackward : public gradients::GradientListener {
 public:
  // One optimizer per parameter of `params` (the reducer's parameter list, same indices).
  OptimizerInBackward(const std::vector<at::Tensor>& params, const ParamOptimizerFactory& factory);
  ~OptimizerInBackward() override;

  void bucket_finished(const gradients::BucketFinished& event) override;
  bool wants_early_finish() const override { return true; }

 private:
  std::vector<at::Tensor> params_;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers_;  // per parameter
};

}  // namespace ddp::optim
