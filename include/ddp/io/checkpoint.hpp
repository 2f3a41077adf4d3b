#pragma once
// Training checkpoints: everything needed to continue a run so that it ends with the parameters
// an uninterrupted run would have, bit for bit.
//
//   <root>/step-<N>/model.safetensors   parameters and buffers by name
//                  /optim.safetensors   SGD momentum buffers or Adam exp_avg/exp_avg_sq/step
//                  /rng.safetensors     the CPU generator's state (CUDA's is not saved:
//                  graphs::StepRng) /manifest.json       step, data position, world size, and each
//                  file's size
//                                       and SHA-256; written last (checkpoint_manifest.hpp)
//
// Writing is atomic: the files go to <root>/.tmp-step-<N>-<pid>/, each fsynced, the manifest last;
// the directory is then renamed to step-<N> (atomically exchanged with an existing step-<N>) and
// <root> is fsynced. A crash leaves either the previous checkpoints or the new complete one, plus
// at most a .tmp-step-* directory that the next save removes. Only after that are older step-*
// directories beyond `keep` deleted.
//
// One writer, parameterised by the sharding (TrainingState::sharding): every rank writes its real
// local piece of each parameter the sharding splits, and of its optimizer state
// ("model.rank-<R>.safetensors", "optim.rank-<R>.safetensors"), rank 0 the rest under the names
// above, all in one directory whose manifest records each split tensor's layout. Replicated state
// (DDP, one process) is the case where nothing is split: rank 0 writes the three files, the other
// ranks nothing. Loading copies, by layout::pieces, the parts this rank's layout wants out of the
// files holding them, so any checkpoint loads onto any mesh and style (sharded_checkpoint.hpp).
// The ranks agree that a save is complete and which checkpoint to load through
// checkpoint_coordinator.hpp (save_and_barrier, resume_latest); this layer touches files only.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "ddp/comm/sharding/sharding.hpp"
#include "ddp/layout/tensor_layouts.hpp"

namespace ddp::io {

// What a checkpoint's manifest.json says (internal: io/checkpoint_manifest.hpp; include it to read
// the fields of what verify_checkpoint and load_checkpoint return).
struct Manifest;

struct CheckpointOptions {
  // Directory holding the step-<N> directories; created on the first save. Required.
  std::string root;
  // Complete checkpoints kept after a save, the new one included; default 3, so that one corrupt
  // or unwanted checkpoint still leaves two to fall back on. 0 keeps all.
  int keep = 3;
  // This process's rank: only rank 0 writes (replicated state); other ranks return from
  // save_checkpoint at once. Split state is saved by save_and_barrier. Default 0, one process.
  int rank = 0;
  // Processes of the run, recorded in the manifest (any checkpoint loads at any world size).
  // Default 1.
  int world_size = 1;
};

// The live objects a checkpoint is taken from and restored into.
struct TrainingState {
  torch::nn::Module* model = nullptr;  // required: parameters and buffers
  // Optional: torch::optim's SGD, Adam, AdamW, RMSprop or Adagrad (another is refused by name);
  // null saves none.
  torch::optim::Optimizer* optimizer = nullptr;
  int64_t step = 0;  // steps completed; load sets it
  // The caller's data cursor, saved and restored as it is; load sets it. The tools keep samples
  // of the global stream consumed, the unit of DistributedSampler::data_position
  // (data/distributed_sampler.hpp), which every world size reads alike.
  int64_t data_position = 0;
  // The caller's samples per step over all ranks, saved as it is. Stated (nonzero) before a load,
  // a checkpoint of another global batch is refused by name before anything changes (a resume
  // that changed it would read other samples per step and mean another schedule); 0 (unstated):
  // load sets it to the checkpoint's (0 for one that did not record it).
  int64_t global_batch = 0;
  // How the wrappers split the model's parameters and over which groups, as the wrapped model
  // answers it (comm/sharding/sharding.hpp): `model.sharding()`, over tensor parallelism
  // `model.sharding(*tp, mesh.parent())`, or `tp->sharding()` alone. Its mesh's product is the
  // number of ranks the save and load run on (the group passed to save_and_barrier and
  // resume_latest, its mesh group), and this rank sits at its layouts' coordinate there. Unset, or
  // a sharding that names no parameter (DDP's: comm::whole_over): every parameter is whole on every
  // rank and rank 0 saves it. Between steps only: a split parameter must be its local storage
  // (layout::padded_local_shape). One writer serves both ([Note: per-rank shard files]).
  std::optional<comm::Sharding> sharding;

  // The sharding's layouts when they split a parameter (name one), else null: what the save and
  // load read.
  const layout::TensorLayouts* split_layouts() const {
    return sharding && !sharding->layouts.by_name.empty() ? &sharding->layouts : nullptr;
  }
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
// Any checkpoint loads at any `world_size` and mesh: a replicated one is read whole by every
// rank; when the checkpoint or the run is split (state.sharding), this rank's wanted pieces are
// copied out of the files holding them, and only those files are read and verified
// (load_resharded_checkpoint in sharded_checkpoint.hpp). `rank` names this process in errors.
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
