#pragma once
// manifest.json of a checkpoint directory: what the checkpoint is (step, data position, world
// size, format version) and which files it holds, each with its byte size and SHA-256. It is
// written last, so its presence says the files were complete; the sizes and checksums say they
// still are.
//
//   {"format": "ddp-checkpoint", "format_version": 2, "step": 20, "data_position": 1280,
//    "world_size": 2, "optimizer": "sgd", "rng": {"cpu": "rng.safetensors",
//    "cuda": "not saved"}, "files": [{"name": "model.safetensors", "bytes": 4096,
//    "sha256": "9f86d0..."}, ...]}
//
// A checkpoint of split state (io/sharded_checkpoint.hpp) adds, per tensor some rank holds only
// part of, its whole shape and its layout over the writing run's mesh (layout/layout.hpp), and the
// optimizer state fields split with it; its files carry the rank that wrote them:
//   "sharded": [{"name": "0.weight", "shape": [7, 5], "mesh": [3],
//                "placements": [{"mesh_dim": 0, "kind": "shard", "dim": 0, "packed": 1}],
//                "optimizer_state": ["momentum_buffer"]}, ...],
//   "files": [..., {"name": "model.rank-1.safetensors", "bytes": 96, "sha256": "..", "rank": 1}]
// Version 1 (before layouts) listed FULLY_SHARD's dim-0 rows per rank instead ("rows": [[0, 3],
// [3, 6], [6, 7]]): it still loads, read as the layout Shard(0) over a mesh of world_size ranks,
// which is what those rows were. Replicated checkpoints have no "sharded" field.

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/layout/layout.hpp"

namespace ddp::io {

// Bumped when a reader of the old version could misread the new one; readers refuse versions
// outside [kOldestCheckpointFormatVersion, kCheckpointFormatVersion]. 2: layouts instead of rows.
constexpr int kCheckpointFormatVersion = 2;
constexpr int kOldestCheckpointFormatVersion = 1;

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

// One tensor of a checkpoint of split state: the writing run's rank r, at coordinate
// layout::coordinate_of(r, layout.mesh), wrote its real local tensor (layout::local_shape, no
// padding) under `name` in "model.rank-<r>.safetensors" when it is the first holder of that piece
// (coordinate 0 on every mesh dim the layout does not split), and the optimizer state fields
// `optimizer_state` (those with the parameter's local shape: momentum_buffer, exp_avg, ...) under
// "<name>.<field>" in "optim.rank-<r>.safetensors". Everything else (parameters no layout splits,
// buffers, Adam's step) is in the replicated files.
struct ShardedTensor {
  std::string name;                          // the parameter's qualified name
  layout::Layout layout;                     // whole shape, the writing run's mesh, placements
  std::vector<std::string> optimizer_state;  // fields saved split; empty without an optimizer
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;           // training steps completed when saved
  int64_t data_position = 0;  // the caller's data cursor (e.g. samples consumed), opaque to us
  // The caller's samples per step over all ranks, opaque to us; 0: not recorded (written only
  // when > 0, so older manifests read as 0).
  int64_t global_batch = 0;
  int world_size = 1;     // processes of the run that wrote it (the product of its layouts' mesh)
  std::string optimizer;  // "sgd", "adam", or "" when no optimizer state was saved
  std::vector<ManifestFile> files;
  // The tensors split over the ranks; empty for a replicated checkpoint (rank 0 wrote all).
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
