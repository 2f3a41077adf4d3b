#pragma once
// A tensor-parallel run's checkpoint holds whole tensors: every rank gathers its shards over the
// tp group before rank 0 writes (whole_tensors, a collective), and every rank takes its slice of
// what it reads (held_tensors, no communication). A checkpoint saved on one mesh therefore loads
// on any other whose tp size divides the split dims (saved at 2x2, resumed at 1x2), and it is the
// file a run without tensor parallelism would write.

#include <string>

#include "ddp/io/checkpoint.hpp"
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

// The same for any registered layouts (checkpoint.hpp's StateLayouts): each split tensor's real
// local part (layout::local_shape from the start of each dim; a sharded style's padding dropped)
// gathered by its parameter's layout, collective over layouts.group in key order; the rest copied.
TensorMap whole_tensors(const StateLayouts& layouts, const TensorMap& held, StateKeys keys);
// This rank's local piece of each split tensor (layout::take_local at layouts.coordinate), at the
// storage shape every coordinate has (layout::padded_local_shape: zero padding where a split
// pads). No communication. Throws naming the tensor when a whole tensor's shape is not its
// layout's.
TensorMap held_tensors(const StateLayouts& layouts, const TensorMap& whole, StateKeys keys);

}  // namespace ddp::io
