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
#include "ddp/shard/sharded_module.hpp"

namespace ddp::io {

// Every parameter of `model` (under each of its names, as named_parameters() lists a tied one)
// and every buffer, at full shape on the CPU: the sharded parameters gathered by the wrapper
// (ShardedModule::full_parameters: one all-gather per unit, padding rows dropped), the buffers as
// this rank holds them. `sharded` wraps `model` over `group`. Collective; call it between steps.
// Every rank gets the whole map: the all-gather delivers it everywhere, so a rank that wants it
// (an evaluation) need not ask again.
TensorMap gather_full_state(comm::ProcessGroup& group, const shard::ShardedModule& sharded,
                            const torch::nn::Module& model);

// gather_full_state, then rank 0 writes it to `path` (atomically): torch.save's format for
// ".pt"/".pth", safetensors otherwise (save_weights in torch_save.hpp). Collective; returns once
// the file is written. A failed write throws c10::Error on every rank, rank 0's naming the file
// and errno's text.
void export_full_state(comm::ProcessGroup& group, const shard::ShardedModule& sharded,
                       const torch::nn::Module& model, const std::string& path);

}  // namespace ddp::io
