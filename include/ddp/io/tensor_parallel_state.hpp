#pragma once
// A tensor-parallel run's checkpoint holds whole tensors: every rank gathers its shards over the
// tp group before rank 0 writes (whole_tensors, a collective), and every rank takes its slice of
// what it reads (held_tensors, no communication). A checkpoint saved on one mesh therefore loads
// on any other whose tp size divides the split dims (saved at 2x2, resumed at 1x2), and it is the
// file a run without tensor parallelism would write.

#include <string>

#include "ddp/io/safetensors.hpp"

namespace ddp::tp {
class TensorParallel;
}

namespace ddp::io {

// What a map's keys name: the model's tensors by name (model_tensors), or optimizer state
// "<parameter name>.<field>" (optimizer_tensors), whose tensors are split as their parameter is.
enum class StateKeys { kModel, kOptimizer };

// `held` (this rank's tensors) made whole; tensors of parameters outside the plan, buffers and
// Adam's scalar "step" come back as copies. Collective over tp's group: every rank calls it with
// the same keys.
TensorMap whole_tensors(const tp::TensorParallel& tp, const TensorMap& held, StateKeys keys);

// This rank's part of `whole`. No communication. Throws naming the tensor when a whole tensor's
// shape does not split over the tp size.
TensorMap held_tensors(const tp::TensorParallel& tp, const TensorMap& whole, StateKeys keys);

}  // namespace ddp::io
