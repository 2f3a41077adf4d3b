#include "checkpoint_contents.hpp"

#include <filesystem>

#include "c10_errors.hpp"
#include "checkpoint_dir.hpp"
#include "ddp/io/checkpoint_state.hpp"

namespace ddp::io::detail {

CheckpointContents replicated_contents(const TrainingState& state) {
  CheckpointContents out;
  out.metadata = {{"format", "ddp-checkpoint"}, {"step", std::to_string(state.step)}};
  out.files.push_back({kModelFile, model_tensors(*state.model), kReplicated});
  if (state.optimizer != nullptr) {
    out.optimizer = optimizer_kind(*state.optimizer);
    out.files.push_back(
        {kOptimFile, optimizer_tensors(*state.optimizer, *state.model), kReplicated});
  }
  out.files.push_back({kRngFile, rng_tensors(), kReplicated});
  return out;
}

std::vector<ManifestFile> write_contents(const std::string& dir,
                                         const CheckpointContents& contents) {
  std::vector<ManifestFile> written;
  for (const ContentFile& f : contents.files) {
    save_safetensors((std::filesystem::path(dir) / f.name).string(), f.tensors, contents.metadata);
    written.push_back(as_c10_error([&] { return describe_file(dir, f.name, f.owner); }));
  }
  return written;
}

}  // namespace ddp::io::detail
