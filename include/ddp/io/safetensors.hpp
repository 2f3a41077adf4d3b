#pragma once
// safetensors (the Hugging Face format) for tensors keyed by name: parameters to initialise from,
// parameters to save, and the batches of the parity mode (docs/bench-protocol.md).
//
// Layout of a file:
//   8 bytes   N, unsigned little-endian
//   N bytes   JSON header: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
//             ..., "__metadata__": {"key": "value"}} (metadata optional, string values only),
//             padded with spaces to a multiple of 8 bytes
//   the rest  the data buffer; [b, e) is relative to its first byte; row-major, little-endian.
//
// dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL. Loading checks the header against the spec
// (the tensors' regions tile the buffer exactly, no trailing bytes) and refuses a bad file with a
// c10::Error that names the file, the tensor and the numbers at fault.

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

namespace ddp::io {

// Sorted by name: saving writes tensors in this order, so one map always gives the same bytes.
using TensorMap = std::map<std::string, at::Tensor>;

// Every tensor of the file, on the CPU, contiguous, with the file's dtype and shape.
TensorMap load_safetensors(const std::string& path);

// Writes `tensors` (moved to the CPU and made contiguous first; dense tensors of the dtypes above)
// and the optional string metadata. Atomic: the bytes go to "<path>.tmp.<pid>", which is fsynced
// and renamed over `path`, then the directory is fsynced; a crash leaves the old file or the new
// one under `path`, never a half-written one.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The "__metadata__" of the file (empty when it has none). Reads and checks the header only.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

}  // namespace ddp::io
