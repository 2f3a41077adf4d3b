#pragma once
// Checkpoints of split state: the training state of a run whose wrappers split its parameters
// (TrainingState::sharding: FULLY_SHARD, DEFAULT, tensor parallelism, or a sharded style over
// TP), written by every rank (its pieces) into one checkpoint directory, and read back onto any
// mesh and style.
//
//   <root>/step-<N>/model.rank-<R>.safetensors  rank R's real local piece (no padding) of every
//                                               split parameter it holds first, by name
//                  /optim.rank-<R>.safetensors  the same of their optimizer state of the
//                                               parameter's local shape ("<name>.exp_avg", ...)
//                  /model.safetensors           rank 0: whole parameters and buffers
//                  /optim.safetensors           rank 0: their optimizer state, and every state
//                                               that is not split (Adam's "<name>.step")
//                  /rng.safetensors             rank 0: the CPU generator
//                  /manifest.json               every file with its size, SHA-256 and writer's
//                                               rank; per split tensor its whole shape and its
//                                               layout over the writing mesh
//                                               (checkpoint_manifest.hpp)
//
// "Holds first": a replica (a mesh dim that does not split the tensor, e.g. dp under DDP over TP)
// is written by its coordinate 0 only, so every element is on disk once.
//
// The directory protocol is the replicated checkpoints' (checkpoint.hpp: temporary directory,
// fsync, manifest last, rename, keep-N); save_and_barrier (checkpoint_coordinator.hpp) runs it
// with every rank writing, and resume_latest / load_checkpoint read it.
//
// [Note: resharding on load] A rank of the loading run wants, of each parameter, what its
// layout gives its coordinate (layout::padded_local_shape storage; whole when the run registers
// no layout). layout::pieces(saved layout, wanted layout, coordinate) says which boxes of which
// writer's local tensor fill it; they are copied out of the rank files (model.safetensors for a
// tensor saved whole) into zero padding, and the optimizer state the same way. A file is
// verified (size, SHA-256) before it is first read, and only files holding wanted pieces are
// read: on an unchanged mesh and style a rank reads its own rank files and the replicated ones.
// Styles and meshes may differ between the runs: FULLY_SHARD over TP saved at (dp 2, tp 2) loads
// as DDP at world 1, as TP 1x2 and as FULLY_SHARD at world 3; a tensor saved whole can load split
// and the other way. Version 1 checkpoints (FULLY_SHARD's rows per rank) load as their layout.

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

// The one writer: rank `rank`'s files of `state` (called between steps, when every split
// parameter is its local storage) into the existing directory `dir`: its rank files (none when
// the sharding splits nothing), and on rank 0 also the replicated files. Each file is written
// atomically (fsynced). Where the sharding splits a parameter, `rank` must be layout::rank_of of
// its layouts' coordinate in their mesh. Throws c10::Error when a
// parameter is not the local storage its layout says (e.g. gathered: "save and load between
// steps") or a write fails (naming the file and errno's text).
ShardFiles write_shard_files(const std::string& dir, const TrainingState& state, int rank);

// load_checkpoint's path for split state (the run's or the checkpoint's): loads `dir`, whose
// `manifest` was read already, into `state` at its sharding's coordinate (every parameter whole
// without one), resharding as the note above says. All checks come before the first change:
// a corrupt file (named, as verify_manifest_file names it), a checkpoint of another model (the
// parameter that differs, and the file or manifest it was found in), or another optimizer throw
// c10::Error and leave the model, the optimizer and the generator as they were.
Manifest load_resharded_checkpoint(const std::string& dir, const Manifest& manifest,
                                   TrainingState& state);

// The error of every entry point that takes a sharding (or a sharded runtime) with a group of
// another size: what happened and which group to pass ("who" names the entry point, e.g.
// "save_and_barrier").
std::string wrong_group_for_sharding(const std::string& who, int layout_ranks, int group_ranks);

// Throws wrong_group_for_sharding when `layouts` are not over `world_size` ranks, or when `rank`
// does not sit at layouts.coordinate (the group is not the one the layouts were made over).
void check_sharding_group(const std::string& who, const layout::TensorLayouts& layouts,
                          int world_size, int rank);

}  // namespace ddp::io
