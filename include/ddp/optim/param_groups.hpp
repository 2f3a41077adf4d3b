#pragma once
// The GPT recipe's optimizer groups (nanoGPT's configure_optimizers): weight decay on the
// parameters with two or more dims (matmul weights, embeddings), none on the rest (biases, norm
// gains), whose decay would only pull them towards 0 without regularizing anything. And the
// learning rate of every group set at once, which a schedule (lr_schedule.hpp) does each step.
//
//   torch::optim::AdamW opt(ddp::optim::weight_decay_groups(
//       params, torch::optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.1)));
//   ...
//   ddp::optim::set_lr(opt, ddp::optim::lr_at(schedule, step));
//
// Under FULLY_SHARD a parameter keeps its dims as a shard (layout::padded_local_shape), so the
// split is the same on every rank and equal to the unsharded model's.

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <utility>
#include <vector>

namespace ddp::optim {

// `params` (distinct tensors) split in their order into {dim >= 2} and {dim < 2}.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> split_by_dims(
    const std::vector<at::Tensor>& params);

// Two groups: the parameters with dim >= 2 with `options` as given (its weight_decay is the
// decay), then those with dim < 2 with the same options but weight_decay 0. An empty group is
// left out. Options: torch::optim's AdamWOptions, AdamOptions, SGDOptions, ... (any with
// weight_decay(double)).
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> weight_decay_groups(
    const std::vector<at::Tensor>& params, const Options& options) {
  auto [decayed, plain] = split_by_dims(params);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) {
    groups.emplace_back(std::move(decayed), std::make_unique<Options>(options));
  }
  if (!plain.empty()) {
    auto no_decay = std::make_unique<Options>(options);
    no_decay->weight_decay(0.0);
    groups.emplace_back(std::move(plain), std::move(no_decay));
  }
  return groups;
}

// Every group's learning rate.
void set_lr(torch::optim::Optimizer& optimizer, double lr);

}  // namespace ddp::optim
