#pragma once
// Training checkpoints: everything needed to continue a run so that it ends with the parameters
// an uninterrupted run would have, bit for bit.
//
//   <root>/step-<N>/model.safetensors   parameters and buffers by name
//                  /optim.safetensors   SGD momentum buffers or Adam exp_avg/exp_avg_sq/step
//                  /rng.safetensors     the CPU generator's state (CUDA's is not saved)
//                  /manifest.json       step, data position, world size, and each file's size
//                                       and SHA-256; written last (checkpoint_manifest.hpp)
//
// Writing is atomic: the files go to <root>/.tmp-step-<N>-<pid>/, each fsynced, the manifest last;
// the directory is then renamed to step-<N> (atomically exchanged with an existing step-<N>) and
// <root> is fsynced. A crash leaves either the previous checkpoints or the new complete one, plus
// at most a .tmp-step-* directory that the next save removes. Only after that are older step-*
// directories beyond `keep` deleted.
//
// Tensor-parallel state (TrainingState::tensor_parallel set) is written as whole tensors, as if
// replicated: every rank gathers, rank 0 writes, every rank loads its slice, at any mesh shape.
//
// Replicated state (data parallel): rank 0 writes, every rank loads. The ranks agree that a save is
// complete and which checkpoint to load through checkpoint_coordinator.hpp (save_and_barrier,
// resume_latest); this layer touches files only.
//
// Sharded state (shard::ShardedModule; TrainingState::shard_plan set): every rank writes its rows
// of the sharded parameters and of their optimizer state ("model.rank-<R>.safetensors",
// "optim.rank-<R>.safetensors"), rank 0 the replicated rest under the names above, all in one
// directory with one manifest; loading reshards to any world size. See sharded_checkpoint.hpp.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "ddp/comm/process_group.hpp"
#include "ddp/io/checkpoint_manifest.hpp"
#include "ddp/layout/tensor_layouts.hpp"
#include "ddp/shard/shard_plan.hpp"

namespace ddp::tp {
class TensorParallel;
}

namespace ddp::io {

struct CheckpointOptions {
  // Directory holding the step-<N> directories; created on the first save. Required.
  std::string root;
  // Complete checkpoints kept after a save, the new one included; default 3, so that one corrupt
  // or unwanted checkpoint still leaves two to fall back on. 0 keeps all.
  int keep = 3;
  // This process's rank: only rank 0 writes (the state is replicated); other ranks return from
  // save_checkpoint at once. Default 0, a single process.
  int rank = 0;
  // Processes of the run, recorded in the manifest (a replicated checkpoint loads at any world
  // size, a sharded one reshards). Default 1.
  int world_size = 1;
};

// How a run's parameters are split, as its wrappers registered it (layout/tensor_layouts.hpp),
// and the group those layouts are over: its size is the product of layouts.mesh and its rank r
// sits at layout::coordinate_of(r, layouts.mesh). FULLY_SHARD over tensor parallelism:
// {layout::nest(tp.layouts(), sharded.layouts()), mesh.parent()}.
struct StateLayouts {
  layout::TensorLayouts layouts;
  comm::ProcessGroupPtr group;
};

// The live objects a checkpoint is taken from and restored into.
struct TrainingState {
  torch::nn::Module* model = nullptr;            // required: parameters and buffers
  torch::optim::Optimizer* optimizer = nullptr;  // optional: SGD or Adam; null saves none
  int64_t step = 0;                              // steps completed; load sets it
  int64_t data_position = 0;                     // caller's data cursor; load sets it
  // The plan of a sharded run (shard::ShardedModule::plan()): its sharded parameters are this
  // rank's [chunk, ...] shards between steps, and the optimizer's state of them too. Default
  // null: every parameter is full on every rank (replicated, DDP).
  const shard::ShardPlan* shard_plan = nullptr;
  // The tensor parallelism of the model (tp::parallelize_module), or null (default: none). The
  // checkpoint then holds whole tensors: saving gathers them over the tp group on every rank (a
  // collective; save_and_barrier calls it on all), loading takes this rank's slice, so a
  // checkpoint loads on another mesh (tensor_parallel_state.hpp). Not with shard_plan.
  const tp::TensorParallel* tensor_parallel = nullptr;
  // The registered layouts of the run's parameters, or null (default). The checkpoint then holds
  // whole tensors, as under tensor_parallel: saving gathers every parameter and its optimizer
  // state by its layout over layouts->group (a collective; save_and_barrier calls it on all),
  // loading takes this rank's local piece of each (zero padding where a split pads). So FULLY_SHARD
  // over TP saved at (dp 2, tp 2) loads as DDP at world 1, as TP 1x2, as FULLY_SHARD at world 3.
  // Not with shard_plan or tensor_parallel.
  const StateLayouts* layouts = nullptr;
};

// "<root>/step-<step>".
std::string checkpoint_dir(const std::string& root, int64_t step);

// Writes <root>/step-<state.step>/ as described above, then deletes old checkpoints beyond
// options.keep. Returns the directory on rank 0, "" on the other ranks (which write nothing).
// On failure throws c10::Error (a refused write names the file and errno's text, e.g. "No space
// left on device"); the existing checkpoints are untouched.
std::string save_checkpoint(const CheckpointOptions& options, const TrainingState& state);

// Checks `dir`'s manifest and every file's size and SHA-256; throws c10::Error naming the file
// and what is wrong ("ddp: checkpoint <dir>/model.safetensors is corrupt: sha256 <got> !=
// manifest <want>").
Manifest verify_checkpoint(const std::string& dir);

// Loads the checkpoint in `dir` (verified first) into state.model, state.optimizer (when not null;
// the checkpoint must then hold that kind of optimizer's state) and the CPU generator; sets
// state.step and state.data_position. Throws, changing nothing, when the checkpoint is corrupt.
// A replicated checkpoint loads at any `world_size` (every rank holds all of it).
// When the checkpoint or the run is sharded, `rank` (this process's, of `world_size`) says which
// rows to load; the world sizes may then differ, and only the files holding those rows are read
// and verified (load_resharded_checkpoint in sharded_checkpoint.hpp).
Manifest load_checkpoint(const std::string& dir, int world_size, TrainingState& state,
                         int rank = 0);

// step-<N> directories under root (complete or not), highest step first; [] if root is absent.
struct CheckpointEntry {
  int64_t step = 0;
  std::string dir;
};
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);

// The highest-step checkpoint under root that verifies (manifest valid, every file's size and
// checksum as listed). One that does not is skipped with a warning through obs/log, shown at the
// default level ("[ddp rank R] ddp: warning: skipping checkpoint ...: <reason>"; `rank` is the R),
// so an older intact one is used. nullopt when none verifies. This is what resume_latest (ddp-train
// --resume) uses: continuing from an older good checkpoint beats stopping, and the warning says
// which one was passed over.
std::optional<CheckpointEntry> find_latest_checkpoint(const std::string& root, int rank = 0);

}  // namespace ddp::io
