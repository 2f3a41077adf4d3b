#pragma once
// Checkpoints that do not stop training: save_and_barrier's checkpoint (checkpoint_coordinator.hpp)
// written by a thread while the next steps run. PyTorch's counterpart is
// torch.distributed.checkpoint.async_save; a C++ writer thread has no GIL to take from training.
//
// save(state), collective, at a step boundary:
//   all:    wait for the save in flight, if any (at most one: the next waits, and says so); its
//           failure anywhere throws here on every rank, as a failed save_and_barrier would
//   all:    rank 0's pid, broadcast, names the temporary directory; rank 0 creates it; a failure
//           count (the last collective of the save)
//   all:    this rank's tensors copied to host memory -- the only time training is blocked; the
//           buffers are kept for the next save, and those of GPU tensors are pinned by the writer
//           once its files are written (a pinned copy is fast, a pinned allocation is not)
//   writer: this rank's files written, fsynced and hashed; their entries (or its error) to the
//           group's store
//   rank 0's writer: waits for every rank's entries in the store (no collective off the main
//           thread), writes the manifest last, renames, prunes -- the same directory protocol as
//           the synchronous save (checkpoint.hpp), so a kill -9 of any rank at any moment leaves
//           the older checkpoints as they were and at most a .tmp-step-* that the next save
//           removes
// poll(), every step, local: says once what the finished save came to (its directory, or its
// error by name on the rank that saw it). wait(), collective: the save in flight finished, and its
// failure thrown on every rank. Replicated state (DDP) goes the same way: rank 0 has every file to
// write, the others report none.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ddp/comm/process_group.hpp"
#include "ddp/io/checkpoint_coordinator.hpp"

namespace ddp::io {

namespace detail {
class HostStaging;
}

struct AsyncCheckpointerOptions {
  // Where and how many: root and keep, as save_and_barrier's.
  CoordinatorOptions coordinator;
  // How long rank 0's writer waits for the other ranks' files before it gives up the save (the
  // older checkpoints stay). Default 30 min: an 8 B model's optimizer state per rank takes
  // minutes on a slow disk; a dead rank ends the run through the collectives long before.
  std::chrono::milliseconds commit_timeout = std::chrono::minutes(30);
};

// What a save cost the step that made it.
struct AsyncSaveStart {
  int64_t step = 0;
  double waited_s = 0;       // for the save before it to finish (0 when none was in flight)
  double blocked_s = 0;      // in save() in all: the wait, the collectives, the copy to host memory
  int64_t staged_bytes = 0;  // this rank's host copy
};

// What a finished save came to, said once by poll().
struct AsyncSaveEnd {
  int64_t step = 0;
  std::string dir;       // rank 0: the published checkpoint; "" elsewhere and on failure
  std::string error;     // "" when this rank's part succeeded
  double written_s = 0;  // from the end of staging to the end of this rank's part
};

class AsyncCheckpointer {
 public:
  // `group` is the one save_and_barrier would take, and must outlive this object.
  AsyncCheckpointer(comm::ProcessGroup& group, AsyncCheckpointerOptions options);
  // Finishes the save in flight (its files complete, rank 0 commits it) unless an exception is
  // unwinding, when rank 0 stops waiting for the others at once and removes the temporary
  // directory. Never throws.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Starts saving `state` as step-<state.step> and returns once its tensors are copied (the
  // protocol above). Collective. Throws c10::Error on every rank when the save before it failed
  // anywhere, or when the temporary directory cannot be made; nothing is started then.
  AsyncSaveStart save(const TrainingState& state);

  // The save that finished since the last call, once; nullopt while it runs or when none did.
  // Local, cheap: call it every step.
  std::optional<AsyncSaveEnd> poll();

  // Waits for the save in flight; throws c10::Error on every rank when it failed anywhere (this
  // rank's own error, or "the background save of checkpoint step-N failed on K rank(s)").
  // Returns the directory on rank 0 of the save it finished ("" elsewhere, when none was in
  // flight, or when poll() has said it already). Collective.
  std::string wait();

  // Whether a save is in flight (started, not yet landed by poll(), save() or wait()).
  bool in_flight() const { return flight_ != nullptr; }

 private:
  struct Flight;  // the save in flight: its writer thread and what it came to
  // Joins the save in flight; what it came to becomes last_, not yet said by poll().
  void land();
  // The failure count of last_ over every rank (collective); throws on every rank when nonzero.
  // Forgets last_ first, so that a caller that catches the error may save again.
  void agree_on_last();

  comm::ProcessGroup& group_;
  AsyncCheckpointerOptions options_;
  std::unique_ptr<detail::HostStaging> staging_;
  std::unique_ptr<Flight> flight_;  // at most one save in flight
  // The last landed save, kept until every rank has agreed on it (the next save or wait()).
  std::optional<AsyncSaveEnd> last_;
  bool last_said_ = false;  // poll() has returned last_
};

}  // namespace ddp::io
