#pragma once
// The full state dict of a split model, for export: what a single-process model's
// named_parameters() and named_buffers() hold, gathered by each parameter's layout. Written by
// save_weights (torch_save.hpp) as safetensors or in torch.save's format, a plain model (C++
// load_model_tensors / load_weights, or Python torch.load) loads it without knowing about shards.
// Not a checkpoint: no optimizer state, no generator, no manifest; resuming training is
// sharded_checkpoint.hpp's job.

#include <string>

#include <torch/nn/module.h>

#include "ddp/comm/process_group.hpp"
#include "ddp/comm/sharding/sharding.hpp"
#include "ddp/io/safetensors.hpp"
#include "ddp/layout/tensor_layouts.hpp"

namespace ddp::io {

// Every parameter of `model` (under each of its names) and every buffer, whole, on the CPU: each
// parameter's local tensor (the real part of what this rank holds: layout::local_shape of its
// layout in `layouts`, from the start of each dim, the padding dropped) gathered by that layout
// over `group` (comm::gather_whole: one all-gather per distinct parameter; a tied one is gathered
// once). `group`'s rank r is the coordinate layout::coordinate_of(r, layouts.mesh) and its size
// the mesh's product; it may be null when the mesh is {1}. Buffers as this rank holds them.
// Collective; call it between steps. The one path of every export: DDP (no layouts), FULLY_SHARD
// (ShardedModule::layouts() over its group), TP (TensorParallel::layouts() over the tp group) and
// FULLY_SHARD over TP (layout::nest of the two, over the mesh's parent group).
TensorMap whole_state(const torch::nn::Module& model, const layout::TensorLayouts& layouts,
                      comm::ProcessGroup* group);
// The same by a sharding (comm/sharding/sharding.hpp: its layouts over its mesh group), as every
// wrapper and tensor parallelism answer it: `whole_state(*net, model.sharding())`, or over tensor
// parallelism `whole_state(*net, model.sharding(*tp, mesh.parent()))`. A nested sharding without
// its mesh group is refused by name.
TensorMap whole_state(const torch::nn::Module& model, const comm::Sharding& sharding);

}  // namespace ddp::io
