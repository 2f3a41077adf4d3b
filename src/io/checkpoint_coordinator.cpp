#include "ddp/io/checkpoint_coordinator.hpp"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <exception>

#include "ddp/comm/control_scalars.hpp"

namespace ddp::io {
namespace {

// Broadcast values of the chosen step besides real steps (>= 0).
constexpr int64_t kNoCheckpoint = -1;
constexpr int64_t kChoiceFailed = -2;

// How many ranks report `failed`: every rank learns whether anyone failed, so that all of them
// stop together instead of the healthy ones waiting in the next collective until its timeout.
int64_t count_failures(comm::ProcessGroup& group, bool failed, const std::string& what) {
  at::Tensor flag = comm::control_tensor(group, {failed ? 1 : 0});
  group.allreduce_sum(flag, what);
  return comm::read_scalar(flag);
}

// Runs `fn` on this rank, then agrees with the others whether it failed anywhere. This rank's own
// error is rethrown as it was; a healthy rank throws `others_failed`.
template <typename Fn>
void on_every_rank(comm::ProcessGroup& group, const std::string& what,
                   const std::string& others_failed, Fn&& fn) {
  std::exception_ptr error;
  try {
    fn();
  } catch (...) {
    error = std::current_exception();
  }
  const int64_t failures = count_failures(group, error != nullptr, what);
  if (error) std::rethrow_exception(error);
  TORCH_CHECK(failures == 0, "ddp: ", others_failed, " on ", failures,
              " rank(s) (their errors say why)");
}

}  // namespace

std::optional<CheckpointEntry> resume_latest(comm::ProcessGroup& group,
                                             const CoordinatorOptions& options,
                                             TrainingState& state) {
  TORCH_CHECK(!options.root.empty(), "ddp: resume_latest: CoordinatorOptions::root is empty");
  // Rank 0 picks; a failure to look (an unreadable directory) still reaches the broadcast, so that
  // the other ranks fail with it instead of waiting there until the timeout.
  std::optional<CheckpointEntry> latest;
  std::exception_ptr choice_error;
  int64_t choice = kNoCheckpoint;
  if (group.rank() == 0) {
    try {
      latest = find_latest_checkpoint(options.root, group.rank());
      if (latest) choice = latest->step;
    } catch (...) {
      choice_error = std::current_exception();
      choice = kChoiceFailed;
    }
  }
  at::Tensor chosen = comm::control_tensor(group, {choice});
  group.broadcast(chosen, 0, "checkpoint choice broadcast");
  choice = comm::read_scalar(chosen);
  if (choice_error) std::rethrow_exception(choice_error);
  TORCH_CHECK(choice != kChoiceFailed, "ddp: rank 0 could not choose a checkpoint in ",
              options.root, " (its error says why)");
  if (choice == kNoCheckpoint) return std::nullopt;

  const CheckpointEntry entry{choice, checkpoint_dir(options.root, choice)};
  on_every_rank(group, "checkpoint load check", "checkpoint " + entry.dir + " could not be loaded",
                [&] { load_checkpoint(entry.dir, group.world_size(), state); });
  return entry;
}

std::string save_and_barrier(comm::ProcessGroup& group, const CoordinatorOptions& options,
                             const TrainingState& state) {
  CheckpointOptions checkpoint;
  checkpoint.root = options.root;
  checkpoint.keep = options.keep;
  checkpoint.rank = group.rank();
  checkpoint.world_size = group.world_size();
  std::string dir;
  // The all-reduce inside is the barrier: nobody returns before rank 0's save has returned, and
  // save_checkpoint returns only once the checkpoint is renamed into place and fsynced.
  on_every_rank(group, "checkpoint barrier",
                "checkpoint step-" + std::to_string(state.step) + " could not be saved",
                [&] { dir = save_checkpoint(checkpoint, state); });
  return dir;
}

}  // namespace ddp::io
