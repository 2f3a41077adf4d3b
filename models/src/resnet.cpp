#include "ddp/models/resnet.hpp"

#include <c10/util/Exception.h>
#include <torch/nn/init.h>
#include <torch/utils.h>

#include "ddp/unit/unit_scope.hpp"

namespace ddp::models {
namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  // No bias: every conv is followed by a BatchNorm, whose shift makes a bias redundant.
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride) {
  TORCH_CHECK(in_channels > 0 && out_channels > 0 && (stride == 1 || stride == 2),
              "BasicBlock: needs positive channel counts and stride 1 or 2, got in=", in_channels,
              " out=", out_channels, " stride=", stride);
  conv1 = register_module("conv1", conv(in_channels, out_channels, 3, stride));
  bn1 = register_module("bn1", ddp::nn::SyncBatchNorm2d(out_channels));
  conv2 = register_module("conv2", conv(out_channels, out_channels, 3, 1));
  bn2 = register_module("bn2", ddp::nn::SyncBatchNorm2d(out_channels));
  if (stride != 1 || in_channels != out_channels) {
    downsample = register_module("downsample",
                                 torch::nn::Sequential(conv(in_channels, out_channels, 1, stride),
                                                       ddp::nn::SyncBatchNorm2d(out_channels)));
  }
}

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  auto out = torch::relu(bn1(conv1(x)));
  out = bn2(conv2(out));
  const auto shortcut = downsample ? downsample->forward(x) : x;
  return torch::relu(out + shortcut);
}

ResNetSmallImpl::ResNetSmallImpl(int64_t num_classes, int64_t width, bool sync_batch_norm) {
  TORCH_CHECK(num_classes > 0 && width > 0,
              "ResNetSmall: sizes must be positive, got num_classes=", num_classes,
              " width=", width);
  // A 3x3 stride-1 stem instead of torchvision's 7x7 stride-2 conv and max-pool: at 32x32 those
  // would leave layer4 a 1x1 map.
  conv1 = register_module("conv1", conv(3, width, 3, 1));
  bn1 = register_module("bn1", ddp::nn::SyncBatchNorm2d(width));
  auto make_layer = [](int64_t in, int64_t out, int64_t stride) {
    return torch::nn::Sequential(BasicBlock(in, out, stride), BasicBlock(out, out, 1));
  };
  layer1 = register_module("layer1", make_layer(width, width, 1));
  layer2 = register_module("layer2", make_layer(width, 2 * width, 2));
  layer3 = register_module("layer3", make_layer(2 * width, 4 * width, 2));
  layer4 = register_module("layer4", make_layer(4 * width, 8 * width, 2));
  fc = register_module("fc", torch::nn::Linear(8 * width, num_classes));

  // torchvision's init, in modules() order (fixed by construction), so the result depends only on
  // the seed. fc keeps Linear's default init, as in torchvision.
  torch::NoGradGuard no_grad;
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = module->as<ddp::nn::SyncBatchNorm2d>()) {
      torch::nn::init::ones_(bn->weight);
      torch::nn::init::zeros_(bn->bias);
      if (!sync_batch_norm) bn->keep_local();
    }
  }
}

torch::Tensor ResNetSmallImpl::forward(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) == 3, "ResNetSmall: expected images [B, 3, H, W], got ",
              x.sizes());
  auto y = torch::relu(bn1(conv1(x)));
  // Each layer through run_unit, so that a sharded wrapper with layerN as units gathers one layer
  // at a time (--fsdp-wrap); a plain forward otherwise.
  for (torch::nn::Sequential* layer : {&layer1, &layer2, &layer3, &layer4}) {
    y = unit::run_unit(
        **layer, [layer](const torch::Tensor& in) { return (*layer)->forward(in); }, y);
  }
  y = torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1);
  return fc(y);
}

}  // namespace ddp::models
