#pragma once
// The full state dict of a sharded model, for export: what a single-process model's
// named_parameters() and named_buffers() hold, gathered from the shards. Written as safetensors or
// in torch.save's format, a plain model (C++ load_model_tensors / load_weights, or Python
// torch.load) loads it without knowing about shards. Not a checkpoint: no optimizer state, no
// generator, no manifest; resuming training is sharded_checkpoint.hpp's job.

#include <string>

#include <torch/nn/module.h>

#include "ddp/comm/process_group.hpp"
#include "ddp/io/safetensors.hpp"
#include "ddp/layout/tensor_layouts.hpp"
#include "ddp/shard/sharded_module.hpp"

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

// whole_state with the sharded module's layouts: every parameter of `model` (under each of its
// names) and every buffer, at full shape on the CPU. `sharded` wraps `model` over `group`.
// Collective; call it between steps. Every rank gets the whole map: the all-gather delivers it
// everywhere, so a rank that wants it (an evaluation) need not ask again.
TensorMap gather_full_state(comm::ProcessGroup& group, const shard::ShardedModule& sharded,
                            const torch::nn::Module& model);

// gather_full_state, then rank 0 writes it to `path` (atomically): torch.save's format for
// ".pt"/".pth", safetensors otherwise (save_weights in torch_save.hpp). Collective; returns once
// the file is written. A failed write throws c10::Error on every rank, rank 0's naming the file
// and errno's text.
void export_full_state(comm::ProcessGroup& group, const shard::ShardedModule& sharded,
                       const torch::nn::Module& model, const std::string& path);

}  // namespace ddp::io
