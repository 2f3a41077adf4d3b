#pragma once
// manifest.json of a checkpoint directory: what the checkpoint is (step, data position, world
// size, format version) and which files it holds, each with its byte size and SHA-256. It is
// written last, so its presence says the files were complete; the sizes and checksums say they
// still are.
//
//   {"format": "ddp-checkpoint", "format_version": 1, "step": 20, "data_position": 1280,
//    "world_size": 2, "optimizer": "sgd", "rng": {"cpu": "rng.safetensors",
//    "cuda": "not saved"}, "files": [{"name": "model.safetensors", "bytes": 4096,
//    "sha256": "9f86d0..."}, ...]}

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::io {

// Bumped when a reader of the old version could misread the new one; readers refuse others.
constexpr int kCheckpointFormatVersion = 1;

// ManifestFile::rank of a file every rank reads (the replicated state: today, every file).
constexpr int kReplicated = -1;

struct ManifestFile {
  std::string name;    // relative to the checkpoint directory, no '/'
  uint64_t bytes = 0;  // file size when written
  std::string sha256;  // lower-case hex of the file's bytes
  // The rank whose shard this file holds, or kReplicated. Room for sharded checkpoints (see
  // [Note: per-rank shard files] in checkpoint_coordinator.hpp): written to the JSON as "rank"
  // only when it is not kReplicated, so replicated checkpoints read as before.
  int rank = kReplicated;
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;           // training steps completed when saved
  int64_t data_position = 0;  // the caller's data cursor (e.g. samples consumed), opaque to us
  int world_size = 1;         // processes of the run that wrote it; resume requires the same
  std::string optimizer;      // "sgd", "adam", or "" when no optimizer state was saved
  std::vector<ManifestFile> files;
};

std::string manifest_to_json(const Manifest& manifest);

// Reads and checks <dir>/manifest.json: present, valid JSON, every field of the right type,
// format version known, file names plain. Throws c10::Error naming the manifest and the fault.
Manifest read_manifest(const std::string& dir);

// Compares every listed file's size, then its SHA-256, against the manifest; throws on the first
// mismatch: "ddp: checkpoint <dir>/<file> is corrupt: <what> != manifest <what>".
void verify_manifest_files(const std::string& dir, const Manifest& manifest);

}  // namespace ddp::io
