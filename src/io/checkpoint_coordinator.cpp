#include "ddp/io/checkpoint_coordinator.hpp"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <exception>
#include <sstream>
#include <vector>

#include <unistd.h>

#include "c10_errors.hpp"
#include "checkpoint_dir.hpp"
#include "ddp/comm/control_scalars.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/io/sharded_checkpoint.hpp"
#include "every_rank.hpp"
#include "store_entries.hpp"

namespace ddp::io {
namespace {

// Broadcast values of the chosen step besides real steps (>= 0).
constexpr int64_t kNoCheckpoint = -1;
constexpr int64_t kChoiceFailed = -2;

using detail::decode_files;  // store_entries.hpp
using detail::encode_files;

// save_and_barrier, every sharding ([Note: per-rank shard files]; nothing split: rank 0 alone has
// files to write, the others report none):
//   all:    rank 0's pid, broadcast, names the temporary directory every rank writes into
//   rank 0: start_checkpoint_dir                          -- then a failure count (a barrier)
//   all:    write_shard_files; its entries to the store   -- failure count
//   rank 0: the entries of every rank into one manifest, written last; rename; prune
//                                                          -- failure count: published for all
// A failure anywhere stops every rank after the step it happened in, and rank 0's guard removes
// the temporary directory: the checkpoints saved before are untouched.
std::string save_by_rank(comm::ProcessGroup& group, const CoordinatorOptions& options,
                         const TrainingState& state) {
  if (state.split_layouts() != nullptr) {
    check_sharding_group("save_and_barrier", *state.split_layouts(), group.world_size(),
                         group.rank());
  }
  const bool root = group.rank() == 0;
  at::Tensor pid = comm::control_tensor(group, {root ? int64_t(::getpid()) : 0});
  group.broadcast(pid, 0, "checkpoint directory broadcast");
  const std::string tmp =
      detail::temp_checkpoint_dir(options.root, state.step, comm::read_scalar(pid));
  // Same number on every rank: exchanges are collective.
  const std::string key = "checkpoint/" + std::to_string(group.next_exchange_id()) + "/";
  const std::string failed =
      "checkpoint step-" + std::to_string(state.step) + " could not be saved";
  detail::TempDirGuard guard{root ? tmp : ""};
  detail::on_every_rank(group, "checkpoint directory check", failed, [&] {
    if (root) as_c10_error([&] { detail::start_checkpoint_dir(options.root, tmp); });
  });
  ShardFiles mine;
  detail::on_every_rank(group, "checkpoint shard check", failed, [&] {
    mine = write_shard_files(tmp, state, group.rank());
    const std::string text = encode_files(mine.files);
    group.store().set(key + std::to_string(group.rank()),
                      std::vector<uint8_t>(text.begin(), text.end()));
  });
  std::string dir;
  detail::on_every_rank(group, "checkpoint publish check", failed, [&] {
    if (!root) return;
    Manifest manifest;
    manifest.step = state.step;
    manifest.data_position = state.data_position;
    manifest.global_batch = state.global_batch;
    manifest.world_size = group.world_size();
    manifest.optimizer = mine.optimizer;
    manifest.sharded = mine.sharded;
    for (int r = 0; r < group.world_size(); ++r) {
      const auto bytes = group.store().get(key + std::to_string(r));
      for (ManifestFile& f : decode_files(std::string(bytes.begin(), bytes.end())))
        manifest.files.push_back(std::move(f));
      group.store().deleteKey(key + std::to_string(r));
    }
    dir = as_c10_error(
        [&] { return detail::finish_checkpoint_dir(options.root, tmp, manifest, options.keep); });
    guard.published = true;
  });
  return dir;
}

}  // namespace

std::optional<CheckpointEntry> resume_latest(comm::ProcessGroup& group,
                                             const CoordinatorOptions& options,
                                             TrainingState& state) {
  const comm::ForPurpose purpose({comm::Purpose::kCheckpoint});
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
  detail::on_every_rank(
      group, "checkpoint load check", "checkpoint " + entry.dir + " could not be loaded",
      [&] { load_checkpoint(entry.dir, group.world_size(), state, group.rank()); });
  return entry;
}

std::string save_and_barrier(comm::ProcessGroup& group, const CoordinatorOptions& options,
                             const TrainingState& state) {
  const comm::ForPurpose purpose({comm::Purpose::kCheckpoint});
  TORCH_CHECK(!options.root.empty(), "ddp: save_and_barrier: CoordinatorOptions::root is empty");
  // The last failure count is the barrier: nobody returns before rank 0 has renamed the
  // checkpoint into place and fsynced its root.
  return save_by_rank(group, options, state);
}

}  // namespace ddp::io
