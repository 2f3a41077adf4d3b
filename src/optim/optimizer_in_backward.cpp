#include "ddp/optim/optimizer_in_backward.hpp"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

namespace ddp::optim {

OptimizerInBackward::OptimizerInBackward(const std::vector<at::Tensor>& params,
                                         const ParamOptimizerFactory& factory)
    : params_(params) {
  TORCH_CHECK(factory, "ddp: set_optimizer_in_backward needs an optimizer factory");
  for (const auto& p : params_) {
    optimizers_.push_back(factory(p));
    TORCH_CHECK(optimizers_.back(), "ddp: the optimizer factory returned null");
  }
}

OptimizerInBackward::~OptimizerInBackward() = default;

void OptimizerInBackward::bucket_finished(const gradients::BucketFinished& event) {
  RECORD_USER_SCOPE("ddp::optimizer_in_backward");
  for (size_t p : *event.params) {
    if (params_[p].grad().defined()) optimizers_[p]->step();
  }
}

}  // namespace ddp::optim
