#pragma once
// Weights in PyTorch's torch.save format (the zip archive torch.save writes by default since 1.6):
// a dict name -> tensor that Python reads with torch.load(path), and that Python's
// torch.save({name: tensor, ...}, path) writes for us to read. Also save_weights / load_weights,
// which pick torch.save or safetensors by the file's extension.
//
// What libtorch's unpickler cannot read, so neither can we (each refused with a message saying
// what to do): the legacy non-zip format (_use_new_zipfile_serialization=False), nn.Parameter
// objects, and an OrderedDict with attributes, which is what model.state_dict() returns; save
// {k: v.detach() for k, v in model.state_dict().items()} from Python instead.

#include <string>

#include "ddp/io/safetensors.hpp"

namespace ddp::io {

// Writes `tensors` (moved to the CPU first) as a torch.save-format dict. Atomic like
// save_safetensors: a temporary file, fsynced, renamed over `path`.
void save_torch(const std::string& path, const TensorMap& tensors);

// The dict of a torch.save file: keys must be strings and values tensors. Tensors come back on the
// CPU with their saved dtype and shape (views are materialized).
TensorMap load_torch(const std::string& path);

// By extension: ".pt" or ".pth" is torch.save format, anything else safetensors.
bool is_torch_save_path(const std::string& path);
void save_weights(const std::string& path, const TensorMap& tensors);
TensorMap load_weights(const std::string& path);

}  // namespace ddp::io
