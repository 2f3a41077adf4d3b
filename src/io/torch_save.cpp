#include "ddp/io/torch_save.hpp"

#include <fstream>
#include <iterator>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize.h>

#include "c10_errors.hpp"
#include "ddp/files/posix_file.hpp"

namespace ddp::io {
namespace {

std::string prefix(const std::string& path) { return "ddp: torch.save file '" + path + "': "; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void save_torch(const std::string& path, const TensorMap& tensors) {
  // A c10::Dict inside an IValue pickles as a plain Python dict; torch::pickle_save writes the zip
  // container (data.pkl plus one record per storage) that torch.load reads.
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(tensor.defined(), prefix(path), "tensor '", name, "' is undefined");
    dict.insert(name, tensor.detach().to(at::kCPU).contiguous());
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  as_c10_error([&] { files::write_file_atomic(path, std::string(bytes.begin(), bytes.end())); });
}

TensorMap load_torch(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.is_open(), prefix(path), "cannot open for reading");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  // Checked here because pickle_load's own message ("failed finding central directory") does not
  // say what the file is.
  TORCH_CHECK(bytes.size() >= 4 && bytes[0] == 'P' && bytes[1] == 'K', prefix(path),
              "not a zip archive, so not torch.save's format (a file from "
              "torch.save(..., _use_new_zipfile_serialization=False) or torch < 1.6 is the legacy "
              "format: load it in Python and save it again)");
  // torch::pickle_load reads torch.save's zip format as it is (checked with python3-torch 1.13:
  // data.pkl under any archive name, storages as records), so no PyTorchStreamReader is needed.
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    // Seen with python3-torch 1.13: model.state_dict() (an OrderedDict carrying a _metadata
    // attribute) fails with "Expected GenericDict but got None", nn.Parameter with "unknown type
    // torch._utils._rebuild_parameter".
    TORCH_CHECK(false, prefix(path), "libtorch cannot unpickle it (", e.what_without_backtrace(),
                "); it reads plain dicts of tensors: from Python, "
                "save {k: v.detach() for k, v in model.state_dict().items()} rather than "
                "model.state_dict() itself or nn.Parameter objects");
  }
  TORCH_CHECK(value.isGenericDict(), prefix(path), "holds ", value.tagKind(),
              ", not a dict of tensors");
  TensorMap out;
  for (const auto& item : value.toGenericDict()) {
    TORCH_CHECK(item.key().isString(), prefix(path), "a key is ", item.key().tagKind(),
                ", not a string");
    const std::string name = item.key().toStringRef();
    TORCH_CHECK(item.value().isTensor(), prefix(path), "value of '", name, "' is ",
                item.value().tagKind(), ", not a tensor");
    out[name] = item.value().toTensor().contiguous();
  }
  return out;
}

bool is_torch_save_path(const std::string& path) {
  return ends_with(path, ".pt") || ends_with(path, ".pth");
}

void save_weights(const std::string& path, const TensorMap& tensors) {
  if (is_torch_save_path(path)) {
    save_torch(path, tensors);
  } else {
    save_safetensors(path, tensors);
  }
}

TensorMap load_weights(const std::string& path) {
  return is_torch_save_path(path) ? load_torch(path) : load_safetensors(path);
}

}  // namespace ddp::io
