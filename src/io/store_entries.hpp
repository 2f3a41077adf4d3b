#pragma once
// Every rank's ManifestFile entries reach rank 0 through the group's store as text, one file a
// line: "<rank> <bytes> <sha256> <name>" (our file names have no spaces or newlines). The
// synchronous sharded save (checkpoint_coordinator.cpp) and the background one
// (async_checkpointer.cpp) both hand them over this way. Private to src/io.

#include <sstream>
#include <string>
#include <vector>

#include "ddp/io/checkpoint_manifest.hpp"

namespace ddp::io::detail {

inline std::string encode_files(const std::vector<ManifestFile>& files) {
  std::ostringstream out;
  for (const ManifestFile& f : files)
    out << f.rank << ' ' << f.bytes << ' ' << f.sha256 << ' ' << f.name << '\n';
  return out.str();
}

inline std::vector<ManifestFile> decode_files(const std::string& text) {
  std::vector<ManifestFile> files;
  std::istringstream in(text);
  ManifestFile f;
  while (in >> f.rank >> f.bytes >> f.sha256 >> f.name) files.push_back(f);
  return files;
}

}  // namespace ddp::io::detail
