#pragma once
// The multi-rank side of checkpoints: which checkpoint every rank resumes from, and when a save is
// complete for everyone. checkpoint.hpp touches files only; this layer adds the collectives.
//
// Resume (resume_latest):
//   rank 0: find_latest_checkpoint(root)  -- the newest step-<N> that verifies; corrupt or
//           incomplete ones are skipped with a warning, so an older intact one is used
//   all:    broadcast the chosen step from rank 0 (-1: none, start fresh)
//   all:    load_checkpoint(step-<N>) into the caller's TrainingState
//   all:    all-reduce "did my load fail": if one rank failed, every rank throws (nobody trains
//           from a state the others do not share, and nobody waits for it in a collective)
// Ranks therefore never disagree about where they resume, even when a newer checkpoint appears or
// is corrupted while they start.
//
// Save (save_and_barrier): every rank writes its files (rank 0 all of them when nothing is split)
// into one temporary directory, rank 0 the manifest last and the rename; a barrier -- nobody goes
// on, and no launcher restart can resume, before the checkpoint is complete on disk. A failed
// write on any rank is reported to every rank through the same collective pattern as a failed
// load.
//
// [Note: per-rank shard files]
// One protocol for every sharding (TrainingState::sharding, the group passed the one it is over:
// its size the mesh's product). Replicated state (DDP; no sharding, or one that splits nothing)
// is the case where only rank 0 has files and every rank reads all of them:
//   - save: rank 0's pid, broadcast, names the temporary directory; rank 0 creates it; every rank
//     writes its own files into it ("model.rank-<R>.safetensors", "optim.rank-<R>.safetensors";
//     rank 0 also the replicated model/optim/rng files) and hashes them itself; their ManifestFile
//     entries (name, bytes, sha256, rank) reach rank 0 through the group's store; rank 0 writes
//     the one manifest listing every rank's files and each split parameter's layout,
//     renames and prunes. A failure count after each step (an all-reduce: also the barrier)
//     stops every rank together, and the temporary directory is removed.
//   - resume: the choice stays rank 0's (find_latest_checkpoint verifies every file, so rank 0
//     hashes the whole checkpoint once); each rank then loads, verifying first, only the files
//     holding pieces it needs (its own on an unchanged mesh and style, plus the replicated
//     ones), so loading stays O(state / world) per rank; another mesh or style reshards
//     (io/sharded_checkpoint.hpp, [Note: resharding on load]).
// The manifest is the only place that lists files, so a checkpoint stays complete-or-absent.

#include <optional>
#include <string>

#include "ddp/comm/process_group.hpp"
#include "ddp/io/checkpoint.hpp"

namespace ddp::io {

struct CoordinatorOptions {
  // Directory holding the step-<N> checkpoints. Required.
  std::string root;
  // Complete checkpoints kept after a save, the new one included; default 3 (as
  // CheckpointOptions::keep: one corrupt checkpoint still leaves two). 0 keeps all.
  int keep = 3;
};

// The checkpoint every rank loaded into `state` (state.step and state.data_position are set), or
// nullopt when none under options.root verifies (then `state` is untouched: start fresh).
// Collective: every rank of `group` must call it. Throws c10::Error on every rank when a rank
// cannot load the chosen checkpoint (the failing rank with its own reason).
std::optional<CheckpointEntry> resume_latest(comm::ProcessGroup& group,
                                             const CoordinatorOptions& options,
                                             TrainingState& state);

// Saves `state` as step-<state.step> (every rank its pieces of what state.sharding splits, rank 0
// the rest; see the note above) and returns once the checkpoint is complete for
// every rank. Returns the directory on rank 0, "" elsewhere. Collective. Throws c10::Error on
// every rank when a write fails (the failing rank with the file and errno's text); the
// checkpoints saved before are untouched.
std::string save_and_barrier(comm::ProcessGroup& group, const CoordinatorOptions& options,
                             const TrainingState& state);

}  // namespace ddp::io
