#include "ddp/io/async_checkpointer.hpp"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "c10_errors.hpp"
#include "checkpoint_contents.hpp"
#include "checkpoint_dir.hpp"
#include "ddp/comm/control_scalars.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/files/posix_file.hpp"
#include "ddp/io/sharded_checkpoint.hpp"
#include "ddp/obs/log.hpp"
#include "every_rank.hpp"
#include "host_staging.hpp"
#include "store_entries.hpp"

namespace ddp::io {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// An exception's text without torch's backtrace: what the error of the next save repeats.
std::string text_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
}

using detail::decode_files;  // store_entries.hpp
using detail::encode_files;

void set_text(c10d::Store& store, const std::string& key, const std::string& text) {
  store.set(key, std::vector<uint8_t>(text.begin(), text.end()));
}

// Everything the writer thread needs, fixed by save() on the main thread.
struct WriteJob {
  c10d::Store* store = nullptr;
  std::string key;  // "<exchange>/": every rank's entries under key + rank
  std::string root, tmp;
  int keep = 3;
  int rank = 0, world_size = 1;
  std::chrono::milliseconds commit_timeout{0};
  detail::CheckpointContents contents;  // staged
  Manifest manifest;                    // step, data position, global batch, world size
};

// Rank 0: every other rank's entries, polled in the store (a get would block past a cancel).
// Throws naming the first rank that failed, or the ranks that did not answer in time.
std::vector<ManifestFile> gather_entries(const WriteJob& job, const std::atomic<bool>& cancel) {
  std::vector<std::string> texts(size_t(job.world_size));
  std::vector<bool> got(size_t(job.world_size), false);
  got[0] = true;
  int missing = job.world_size - 1;
  const auto deadline = Clock::now() + job.commit_timeout;
  while (missing > 0) {
    for (int r = 1; r < job.world_size; ++r) {
      const std::string key = job.key + std::to_string(r);
      if (got[size_t(r)] || !job.store->check({key})) continue;
      const std::vector<uint8_t> bytes = job.store->get(key);
      job.store->deleteKey(key);
      texts[size_t(r)].assign(bytes.begin(), bytes.end());
      got[size_t(r)] = true;
      --missing;
    }
    if (missing == 0) break;
    TORCH_CHECK(!cancel.load(),
                "ddp: stopped waiting for the other ranks' files: the process is "
                "ending with an error");
    if (Clock::now() >= deadline) {
      std::string ranks;
      for (int r = 1; r < job.world_size; ++r)
        if (!got[size_t(r)]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      TORCH_CHECK(false, "ddp: rank(s) ", ranks, " did not report their files within ",
                  job.commit_timeout.count() / 1000.0,
                  " s (AsyncCheckpointerOptions::commit_timeout)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a background poll
  }
  std::vector<ManifestFile> entries;
  for (int r = 1; r < job.world_size; ++r) {
    const std::string& text = texts[size_t(r)];
    TORCH_CHECK(text.empty() || text[0] != '!', "ddp: rank ", r, " could not write its files: ",
                without_ddp_prefix(text.substr(text.empty() ? 0 : 1)));
    for (ManifestFile& f : decode_files(text)) entries.push_back(std::move(f));
  }
  return entries;
}

// The writer thread's work: this rank's files, then (rank 0) the manifest and the rename.
// Returns the published directory on rank 0.
std::string write_checkpoint(WriteJob& job, const std::atomic<bool>& cancel) {
  const bool root = job.rank == 0;
  detail::TempDirGuard guard{root ? job.tmp : ""};
  std::vector<ManifestFile> mine;
  std::exception_ptr write_error;
  try {
    mine = detail::write_contents(job.tmp, job.contents);
  } catch (...) {
    write_error = std::current_exception();
  }
  if (!root) {
    set_text(*job.store, job.key + std::to_string(job.rank),
             write_error ? "!" + text_of(write_error) : encode_files(mine));
    if (write_error) std::rethrow_exception(write_error);
    return "";
  }
  // Rank 0 hears every rank out before its guard removes the directory they write into, so
  // that each failure is reported as itself, not as a missing directory.
  std::vector<ManifestFile> others = gather_entries(job, cancel);
  if (write_error) std::rethrow_exception(write_error);
  job.manifest.optimizer = job.contents.optimizer;
  job.manifest.sharded = job.contents.sharded;
  job.manifest.files = std::move(mine);
  for (ManifestFile& f : others) job.manifest.files.push_back(std::move(f));
  const std::string dir = as_c10_error(
      [&] { return detail::finish_checkpoint_dir(job.root, job.tmp, job.manifest, job.keep); });
  guard.published = true;
  return dir;
}

}  // namespace

struct AsyncCheckpointer::Flight {
  std::thread thread;  // not joinable when staging failed
  std::atomic<bool> done{false};
  std::atomic<bool> cancel{false};
  AsyncSaveEnd end;  // written by the thread before `done`
};

AsyncCheckpointer::AsyncCheckpointer(comm::ProcessGroup& group, AsyncCheckpointerOptions options)
    : group_(group),
      options_(std::move(options)),
      staging_(std::make_unique<detail::HostStaging>()) {
  TORCH_CHECK(!options_.coordinator.root.empty(),
              "ddp: AsyncCheckpointer: AsyncCheckpointerOptions::coordinator.root is empty");
  TORCH_CHECK(options_.coordinator.keep >= 0, "ddp: AsyncCheckpointer: keep ",
              options_.coordinator.keep, " is negative (0 keeps every checkpoint)");
  TORCH_CHECK(options_.commit_timeout.count() > 0,
              "ddp: AsyncCheckpointer: commit_timeout must be positive, got ",
              options_.commit_timeout.count(), " ms");
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (!flight_) return;
  if (std::uncaught_exceptions() > 0) flight_->cancel = true;
  if (flight_->thread.joinable()) flight_->thread.join();
}

void AsyncCheckpointer::land() {
  if (!flight_) return;
  if (flight_->thread.joinable()) flight_->thread.join();
  last_ = flight_->end;
  last_said_ = false;
  flight_.reset();
}

std::optional<AsyncSaveEnd> AsyncCheckpointer::poll() {
  if (flight_ && flight_->done.load()) land();
  if (!last_ || last_said_) return std::nullopt;
  last_said_ = true;
  if (!last_->error.empty()) {
    obs::log(obs::LogLevel::kError, group_.rank(),
             "ddp: the background save of checkpoint step-" + std::to_string(last_->step) +
                 " failed: " + without_ddp_prefix(last_->error) +
                 " (the checkpoints saved before it are intact; the next save or wait() throws)");
  }
  return last_;
}

void AsyncCheckpointer::agree_on_last() {
  const bool failed = last_ && !last_->error.empty();
  const int64_t step = last_ ? last_->step : -1;
  const std::string error = failed ? last_->error : "";
  // Agreed once: a caller that catches the error may save again.
  last_.reset();
  const int64_t failures =
      detail::count_failures(group_, failed, "checkpoint background save check");
  TORCH_CHECK(!failed, "ddp: the background save of checkpoint step-", step,
              " failed: ", without_ddp_prefix(error));
  TORCH_CHECK(failures == 0, "ddp: the background save of the last checkpoint failed on ", failures,
              " rank(s) (their errors say why)");
}

AsyncSaveStart AsyncCheckpointer::save(const TrainingState& state) {
  const comm::ForPurpose purpose({comm::Purpose::kCheckpoint});
  const Clock::time_point start = Clock::now();
  TORCH_CHECK(state.model != nullptr, "ddp: AsyncCheckpointer::save: TrainingState::model is null");
  TORCH_CHECK(state.step >= 0, "ddp: AsyncCheckpointer::save: step ", state.step, " is negative");
  AsyncSaveStart out;
  out.step = state.step;
  if (flight_ && !flight_->done.load()) {
    const int64_t before = flight_->end.step;
    land();
    out.waited_s = seconds_since(start);
    char waited[32];
    std::snprintf(waited, sizeof waited, "%.2f", out.waited_s);
    obs::log(obs::LogLevel::kWarn, group_.rank(),
             "ddp: checkpoint step-" + std::to_string(state.step) + " waited " + waited +
                 " s for step-" + std::to_string(before) +
                 "'s background save (one save is in flight at a time: save less often, or to "
                 "a faster disk)");
  }
  land();
  agree_on_last();

  if (state.split_layouts() != nullptr) {
    check_sharding_group("AsyncCheckpointer::save", *state.split_layouts(), group_.world_size(),
                         group_.rank());
  }
  const bool root = group_.rank() == 0;
  at::Tensor pid = comm::control_tensor(group_, {root ? int64_t(::getpid()) : 0});
  group_.broadcast(pid, 0, "checkpoint directory broadcast");
  auto job = std::make_unique<WriteJob>();
  job->store = &group_.store();
  job->key = "checkpoint/" + std::to_string(group_.next_exchange_id()) + "/";
  job->root = options_.coordinator.root;
  job->tmp = detail::temp_checkpoint_dir(job->root, state.step, comm::read_scalar(pid));
  job->keep = options_.coordinator.keep;
  job->rank = group_.rank();
  job->world_size = group_.world_size();
  job->commit_timeout = options_.commit_timeout;
  job->manifest.step = state.step;
  job->manifest.data_position = state.data_position;
  job->manifest.global_batch = state.global_batch;
  job->manifest.world_size = group_.world_size();
  detail::on_every_rank(
      group_, "checkpoint directory check",
      "checkpoint step-" + std::to_string(state.step) + " could not be saved", [&] {
        if (root) as_c10_error([&] { detail::start_checkpoint_dir(job->root, job->tmp); });
      });

  flight_ = std::make_unique<Flight>();
  flight_->end.step = state.step;
  try {
    job->contents = staging_->stage(detail::rank_contents(state, group_.rank()));
  } catch (...) {
    // Reported as a failed write would be (poll(), then the next save on every rank); rank 0's
    // writer hears of it through the store, and without rank 0's writer the directory goes.
    flight_->end.error = text_of(std::current_exception());
    if (!root)
      set_text(group_.store(), job->key + std::to_string(group_.rank()), "!" + flight_->end.error);
    if (root) files::remove_tree(job->tmp);
    flight_->done = true;
    out.blocked_s = seconds_since(start);
    return out;
  }
  out.staged_bytes = staging_->bytes();
  Flight* flight = flight_.get();
  detail::HostStaging* staging = staging_.get();
  flight->thread = std::thread([flight, staging, job = std::move(job)]() mutable {
    const Clock::time_point written = Clock::now();
    try {
      flight->end.dir = write_checkpoint(*job, flight->cancel);
    } catch (...) {
      flight->end.error = text_of(std::current_exception());
    }
    flight->end.written_s = seconds_since(written);
    job.reset();  // the staged tensors' references: pinning replaces their buffers
    staging->pin_for_next_save();
    flight->done = true;
  });
  out.blocked_s = seconds_since(start);
  return out;
}

std::string AsyncCheckpointer::wait() {
  const comm::ForPurpose purpose({comm::Purpose::kCheckpoint});
  land();
  const std::string dir = last_ && !last_said_ ? last_->dir : "";
  agree_on_last();
  return dir;
}

}  // namespace ddp::io
