#include "checkpoint_contents.hpp"

#include <filesystem>

#include "c10_errors.hpp"
#include "checkpoint_dir.hpp"

namespace ddp::io::detail {

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
