#pragma once
// ddp-train's --checkpoint-every saves: synchronous (io::save_and_barrier: every rank waits until
// the checkpoint is on disk) or, with --checkpoint-async, in the background (io::AsyncCheckpointer:
// training waits only for the copy to host memory). Each save's line says how long it blocked the
// step, the number to compare the two by.

#include <memory>
#include <optional>

#include "ddp/io/async_checkpointer.hpp"

namespace ddp::tools {

class CheckpointSaver {
 public:
  // `lead` prints the lines (rank 0). `group` outlives this object.
  CheckpointSaver(comm::ProcessGroup& group, const io::CoordinatorOptions& options, bool async,
                  bool lead);

  // Saves `state` as step-<state.step>. Collective. Throws on every rank when a save (this one,
  // or the background one before it) failed.
  void save(const io::TrainingState& state);

  // Every step: says once that a background save landed (its directory), or, on the ranks that
  // saw it, why it failed (the library's error line; the next save or finish() throws).
  void poll();

  // The end of the run: the background save in flight finished. Collective.
  void finish();

 private:
  comm::ProcessGroup& group_;
  io::CoordinatorOptions options_;
  bool lead_;
  std::unique_ptr<io::AsyncCheckpointer> async_;  // null: synchronous saves
};

}  // namespace ddp::tools
