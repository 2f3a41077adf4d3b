#pragma once
// The synthetic tasks behind the named workloads (registry.hpp): each fills a Workload's batch
// stream and loss for a model set with set_model. Shared by the zoo and by the test-only nets in
// tests/support, so both get the same deterministic, rank-sliceable data.

#include <cstdint>
#include <utility>

#include <torch/nn/modules/container/any.h>

#include "ddp/models/registry.hpp"

namespace ddp::models {

// w.module and w.ptr both become `model` (a TORCH_MODULE holder).
template <typename Holder>
void set_model(Workload& w, Holder model) {
  w.ptr = model.ptr();
  w.module = torch::nn::AnyModule(std::move(model));
}

// Regression: x ~ N(0, 1) of width `in`, target a fixed low-rank linear map of x of width `out`;
// squared error summed over features, mean over the batch.
void add_regression_task(Workload& w, int64_t in, int64_t out, uint64_t seed);

// Next token: sequences counting up by one from a random start (mod vocab), targets shifted by
// one; cross entropy over all tokens.
void add_counting_task(Workload& w, int64_t vocab, int64_t seq_len, uint64_t seed);

// Classification of single tokens: target = (3 * input + 1) mod vocab; cross entropy.
void add_affine_token_task(Workload& w, int64_t vocab, uint64_t seed);

// Image class: x [3, 32, 32], an oriented colour grating per class (its phase random) under
// N(0, 1) noise; cross entropy.
void add_image_class_task(Workload& w, int64_t classes, uint64_t seed);

}  // namespace ddp::models
