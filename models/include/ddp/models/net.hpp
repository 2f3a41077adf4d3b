#pragma once
// The seed test's Net: four square Linear layers and no activation, so that its parameters (and
// therefore the bucket layout) are exactly those of PyTorch's DDP seed test.

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

namespace ddp::models {

// Parameters, in named_parameters() order: fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc3.weight,
// fc3.bias, fc4.weight, fc4.bias. With dim = 2000 that is 4 x 16.008 MB, which default bucket caps
// (1 MiB first, then 25 MiB) split into the seed acceptance layout [fc4], [fc3, fc2], [fc1].
class NetImpl : public torch::nn::Module {
 public:
  // 2000: the width of the seed test; smaller widths keep CPU tests quick.
  explicit NetImpl(int64_t dim = 2000);

  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::nn::Linear fc3{nullptr};
  torch::nn::Linear fc4{nullptr};
  // false (default): activations kept. true: every layer's are recomputed in backward.
  bool checkpoint_units = false;
};
TORCH_MODULE(Net);

}  // namespace ddp::models
