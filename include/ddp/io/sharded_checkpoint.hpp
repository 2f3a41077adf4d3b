#pragma once
// Sharded checkpoints: the training state of a shard::ShardedModule run, written by every rank
// (its shard) into one checkpoint directory, and read back at any world size.
//
//   <root>/step-<N>/model.rank-<R>.safetensors  rank R's real rows (no padding) of every sharded
//                                               parameter, keyed by the parameter's name
//                  /optim.rank-<R>.safetensors  rank R's rows of their optimizer state of the
//                                               parameter's shape ("<name>.exp_avg", ...)
//                  /model.safetensors           rank 0: replicated parameters and buffers
//                  /optim.safetensors           rank 0: their optimizer state, and every state
//                                               that is not row-shaped (Adam's "<name>.step")
//                  /rng.safetensors             rank 0: the CPU generator
//                  /manifest.json               every file with its size, SHA-256 and writer's
//                                               rank; per sharded parameter its full shape and
//                                               each rank's global rows (checkpoint_manifest.hpp)
//
// The directory protocol is the replicated checkpoints' (checkpoint.hpp: temporary directory,
// fsync, manifest last, rename, keep-N); save_and_barrier (checkpoint_coordinator.hpp) runs it
// with every rank writing, and resume_latest / load_checkpoint read it.
//
// [Note: resharding on load] A rank of the loading run wants, of each parameter, the global rows
// its plan gives it (shard/row_pieces.hpp: its real rows when sharded, all rows when replicated,
// a run without a plan wants all rows). Those rows are copied out of the files that hold them --
// the rank files of the sharded parameters, model.safetensors for the replicated ones -- into a
// zero-padded [chunk, ...] shard (or the full tensor), and the optimizer state the same way. A
// file is verified (size, SHA-256) before it is first read, and only files holding wanted rows
// are read: at an unchanged world size and plan, a rank reads its own rank files and the
// replicated ones. Placements may differ between the runs (DEFAULT shards dim 0 only where it
// divides the world size): a parameter saved sharded can load replicated and the other way.

#include <string>
#include <vector>

#include "ddp/io/checkpoint.hpp"
#include "ddp/io/checkpoint_manifest.hpp"

namespace ddp::io {

// "model.rank-<rank>.safetensors" and "optim.rank-<rank>.safetensors".
std::string model_shard_file(int rank);
std::string optim_shard_file(int rank);

// What write_shard_files wrote and what the manifest must say about it.
struct ShardFiles {
  std::vector<ManifestFile> files;     // this rank's files: size, SHA-256, rank (or kReplicated)
  std::vector<ShardedTensor> sharded;  // the manifest's table: the same on every rank
  std::string optimizer;               // "sgd", "adam", or "" without an optimizer
};

// Writes rank `rank`'s files of `state` (shard_plan set; called between steps, when every sharded
// parameter is its [chunk, ...] shard) into the existing directory `dir`: the model and optimizer
// rank files, and on rank 0 also the replicated files. Each file is written atomically (fsynced).
// Throws c10::Error when a parameter is not the shard its plan says (e.g. gathered: "call it
// between steps") or a write fails (naming the file and errno's text).
ShardFiles write_shard_files(const std::string& dir, const TrainingState& state, int rank);

// load_checkpoint's path for sharded state (the run's or the checkpoint's): loads `dir`, whose
// `manifest` was read already, into `state` as rank `rank` of `world_size`, resharding as the
// note above says. All checks come before the first change: a corrupt file (named, as
// verify_manifest_file names it), a checkpoint of another model (the parameter that differs, and
// the file or manifest it was found in), another optimizer, or a plan of another world size
// throw c10::Error and leave the model, the optimizer and the generator as they were.
Manifest load_resharded_checkpoint(const std::string& dir, const Manifest& manifest, int rank,
                                   int world_size, TrainingState& state);

// The error of every entry point that takes a shard plan with a group of another size: what
// happened and which group to pass ("who" names the entry point, e.g. "save_and_barrier").
std::string wrong_group_for_plan(const std::string& who, int plan_world, int group_ranks);

}  // namespace ddp::io
