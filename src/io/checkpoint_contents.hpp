#pragma once
// What one rank puts into a checkpoint directory, as tensors before they are files: each file's
// name, tensors and owner, and what the manifest says of them. Collecting (reading the live
// model and optimizer) is apart from writing so that the background save (async_checkpointer.hpp)
// can copy the tensors to host memory between the two; the synchronous saves collect and write at
// once. Private to src/io.

#include <map>
#include <string>
#include <vector>

#include "ddp/io/checkpoint.hpp"
#include "ddp/io/checkpoint_manifest.hpp"
#include "ddp/io/safetensors.hpp"

namespace ddp::io::detail {

struct ContentFile {
  std::string name;         // relative to the checkpoint directory
  TensorMap tensors;        // views of the live state until staged
  int owner = kReplicated;  // ManifestFile::rank
};

struct CheckpointContents {
  std::vector<ContentFile> files;               // this rank's; none on a rank that writes nothing
  std::vector<ShardedTensor> sharded;           // the manifest's table: the same on every rank
  std::string optimizer;                        // optimizer_kind, or "" without an optimizer
  std::map<std::string, std::string> metadata;  // every file's safetensors "__metadata__"
};

// Rank `rank`'s files of `state`, by its sharding: its pieces of what the sharding splits, and on
// rank 0 also the replicated files (model, optimizer when set, CPU generator; all of the model
// when nothing is split). write_shard_files' checks (sharded_checkpoint.hpp).
CheckpointContents rank_contents(const TrainingState& state, int rank);

// Writes every file of `contents` into the existing directory `dir`, each atomically (fsynced),
// and returns their manifest entries (size and SHA-256 as on disk).
std::vector<ManifestFile> write_contents(const std::string& dir,
                                         const CheckpointContents& contents);

}  // namespace ddp::io::detail
