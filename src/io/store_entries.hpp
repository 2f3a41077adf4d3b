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

// Ends with "end": never an empty value, even from a rank with no files (a replicated state's
// ranks but 0). An empty value in libtorch 1.13's TCPStore is only seen by get() and check()
// after a delay (measured 0.25-0.6 s a save), which every save then waited out.
inline std::string encode_files(const std::vector<ManifestFile>& files) {
  std::ostringstream out;
  for (const ManifestFile& f : files)
    out << f.rank << ' ' << f.bytes << ' ' << f.sha256 << ' ' << f.name << '\n';
  out << "end\n";
  return out.str();
}

// Reads the lines up to "end" (which does not parse as a rank).
inline std::vector<ManifestFile> decode_files(const std::string& text) {
  std::vector<ManifestFile> files;
  std::istringstream in(text);
  ManifestFile f;
  while (in >> f.rank >> f.bytes >> f.sha256 >> f.name) files.push_back(f);
  return files;
}

}  // namespace ddp::io::detail
