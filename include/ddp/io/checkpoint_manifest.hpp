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
//
// A sharded checkpoint (io/sharded_checkpoint.hpp) adds, per parameter split on dim 0, its full
// shape, the global rows each rank wrote and the optimizer state fields saved with those rows;
// its files carry the rank that wrote them:
//   "sharded": [{"name": "0.weight", "shape": [7, 5], "rows": [[0, 3], [3, 6], [6, 7]],
//                "optimizer_state": ["momentum_buffer"]}, ...],
//   "files": [..., {"name": "model.rank-1.safetensors", "bytes": 96, "sha256": "..", "rank": 1}]
// Replicated checkpoints have no "sharded" field and read exactly as before.

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/shard/row_pieces.hpp"

namespace ddp::io {

// Bumped when a reader of the old version could misread the new one; readers refuse others.
constexpr int kCheckpointFormatVersion = 1;

// ManifestFile::rank of a file every rank may read (the replicated state).
constexpr int kReplicated = -1;

struct ManifestFile {
  std::string name;    // relative to the checkpoint directory, no '/'
  uint64_t bytes = 0;  // file size when written
  std::string sha256;  // lower-case hex of the file's bytes
  // The rank whose shard this file holds, or kReplicated (see [Note: per-rank shard files] in
  // checkpoint_coordinator.hpp): written to the JSON as "rank" only when it is not kReplicated,
  // so replicated checkpoints read as before.
  int rank = kReplicated;
};

// One parameter of a sharded checkpoint: rank r wrote its global rows `rows[r]` under `name` in
// "model.rank-<r>.safetensors", and the optimizer state fields `optimizer_state` (those with the
// parameter's shape: momentum_buffer, exp_avg, ...) under "<name>.<field>" in
// "optim.rank-<r>.safetensors". Everything else (replicated parameters, buffers, Adam's step) is
// in the replicated files.
struct ShardedTensor {
  std::string name;                          // the parameter's qualified name
  std::vector<int64_t> shape;                // its full shape; dim 0 is what is split
  std::vector<shard::RowRange> rows;         // per rank of the writing run: world_size entries
  std::vector<std::string> optimizer_state;  // fields saved by rows; empty without an optimizer
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;           // training steps completed when saved
  int64_t data_position = 0;  // the caller's data cursor (e.g. samples consumed), opaque to us
  int world_size = 1;  // processes of the run that wrote it; a replicated resume requires the same
  std::string optimizer;  // "sgd", "adam", or "" when no optimizer state was saved
  std::vector<ManifestFile> files;
  // The parameters split over the ranks; empty for a replicated checkpoint (rank 0 wrote all).
  std::vector<ShardedTensor> sharded;
};

std::string manifest_to_json(const Manifest& manifest);

// Reads and checks <dir>/manifest.json: present, valid JSON, every field of the right type,
// format version known, file names plain. Throws c10::Error naming the manifest and the fault.
Manifest read_manifest(const std::string& dir);

// Compares one listed file's size, then its SHA-256, with the manifest; throws as below.
void verify_manifest_file(const std::string& dir, const ManifestFile& file);

// Compares every listed file's size, then its SHA-256, against the manifest; throws on the first
// mismatch: "ddp: checkpoint <dir>/<file> is corrupt: <what> != manifest <what>".
void verify_manifest_files(const std::string& dir, const Manifest& manifest);

}  // namespace ddp::io
