#include "ddp/io/checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include <fcntl.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include "c10_errors.hpp"
#include "checkpoint_contents.hpp"
#include "checkpoint_dir.hpp"
#include "ddp/files/posix_file.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/io/safetensors.hpp"
#include "ddp/io/sha256.hpp"
#include "ddp/io/sharded_checkpoint.hpp"
#include "ddp/obs/log.hpp"

namespace ddp::io {
namespace {

namespace fs = std::filesystem;
using detail::kModelFile;
using detail::kOptimFile;
using detail::kRngFile;

constexpr const char* kTmpPrefix = ".tmp-step-";

// "step-<digits>" -> the step; anything else (temp directories, user files) -> nullopt.
std::optional<int64_t> parse_step_name(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 18 ||
      name.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// ".tmp-step-<N>-<pid>" left by a save that died: removed unless its writer still runs.
void remove_stale_temporaries(const fs::path& root) {
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kTmpPrefix, 0) != 0) continue;
    const auto dash = name.rfind('-');
    const pid_t pid = pid_t(std::atol(name.c_str() + dash + 1));
    const bool writer_alive =
        pid > 0 && pid != ::getpid() && (::kill(pid, 0) == 0 || errno == EPERM);
    if (writer_alive) continue;
    files::remove_tree(entry.path().string());
  }
}

// Moves the finished temporary directory to `final`. An existing `final` (a checkpoint of the same
// step from an earlier attempt) is swapped out atomically and then removed, so that at every
// instant step-<N> is one complete checkpoint.
void publish(const fs::path& tmp, const fs::path& final) {
  if (::rename(tmp.c_str(), final.c_str()) == 0) return;
  const int rename_errno = errno;
  TORCH_CHECK(rename_errno == ENOTEMPTY || rename_errno == EEXIST, "ddp: checkpoint: renaming ",
              tmp, " to ", final, " failed: ", std::strerror(rename_errno));
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) == 0) {
    files::remove_tree(tmp.string());  // now the old checkpoint
    return;
  }
  // File systems without RENAME_EXCHANGE: move the old one aside first. A crash in between
  // leaves no step-<N>, and the older checkpoints stay as they were.
  const fs::path aside = fs::path(tmp).concat(".old");
  TORCH_CHECK(::rename(final.c_str(), aside.c_str()) == 0, "ddp: checkpoint: moving ", final,
              " aside failed: ", std::strerror(errno));
  TORCH_CHECK(::rename(tmp.c_str(), final.c_str()) == 0, "ddp: checkpoint: renaming ", tmp, " to ",
              final, " failed: ", std::strerror(errno));
  files::remove_tree(aside.string());
}

// Keeps the checkpoint just written and the keep-1 newest older ones. Directories of higher steps
// (from a run that went further before it was resumed from an older checkpoint) are left alone:
// they are not older, and the run replaces each when it reaches that step again.
void prune(const std::string& root, int64_t written_step, int keep) {
  if (keep <= 0) return;
  int kept = 1;  // the one just written
  for (const CheckpointEntry& e : list_checkpoints(root)) {
    if (e.step >= written_step) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    if (const int err = files::remove_tree(e.dir)) {
      obs::log(
          obs::LogLevel::kWarn, 0,
          "ddp: warning: could not delete old checkpoint " + e.dir + ": " + std::strerror(err));
    }
  }
}

// save_checkpoint's body; FileErrors from it become c10::Errors there.
std::string save_checkpoint_files(const CheckpointOptions& options, const TrainingState& state) {
  TORCH_CHECK(!options.root.empty(), "ddp: save_checkpoint: CheckpointOptions::root is empty");
  TORCH_CHECK(state.model != nullptr, "ddp: save_checkpoint: TrainingState::model is null");
  TORCH_CHECK(state.step >= 0, "ddp: save_checkpoint: step ", state.step, " is negative");
  TORCH_CHECK(options.keep >= 0, "ddp: save_checkpoint: keep ", options.keep,
              " is negative (0 keeps every checkpoint)");
  int64_t layout_ranks = 1;
  if (state.split_layouts() != nullptr) {
    for (const int64_t size : state.split_layouts()->mesh) layout_ranks *= size;
  }
  TORCH_CHECK(layout_ranks == 1, "ddp: save_checkpoint: the state is split over ", layout_ranks,
              " ranks; every rank writes its pieces, so save with save_and_barrier "
              "(checkpoint_coordinator.hpp)");
  if (options.rank != 0) return "";  // replicated state: rank 0's copy is the checkpoint

  const std::string tmp = detail::temp_checkpoint_dir(options.root, state.step, ::getpid());
  detail::TempDirGuard guard{tmp};
  detail::start_checkpoint_dir(options.root, tmp);

  Manifest manifest;
  manifest.step = state.step;
  manifest.data_position = state.data_position;
  manifest.global_batch = state.global_batch;
  manifest.world_size = options.world_size;
  // The one writer as rank 0 (split state on one process: its one piece is everything, and the
  // checkpoint records the layouts like one written by more ranks).
  ShardFiles files = write_shard_files(tmp, state, 0);
  manifest.optimizer = files.optimizer;
  manifest.files = std::move(files.files);
  manifest.sharded = std::move(files.sharded);
  const std::string final =
      detail::finish_checkpoint_dir(options.root, tmp, manifest, options.keep);
  guard.published = true;
  return final;
}

}  // namespace

namespace detail {

std::string temp_checkpoint_dir(const std::string& root, int64_t step, int64_t pid) {
  return (fs::path(root) / (kTmpPrefix + std::to_string(step) + "-" + std::to_string(pid)))
      .string();
}

void start_checkpoint_dir(const std::string& root, const std::string& tmp) {
  std::error_code ec;
  fs::create_directories(root, ec);
  TORCH_CHECK(!ec, "ddp: checkpoint: cannot create directory ", fs::path(root), ": ", ec.message());
  remove_stale_temporaries(root);
  files::remove_tree(tmp);
  fs::create_directory(tmp, ec);
  TORCH_CHECK(!ec, "ddp: checkpoint: cannot create directory ", fs::path(tmp), ": ", ec.message());
}

ManifestFile describe_file(const std::string& dir, const std::string& name, int rank) {
  const std::string path = (fs::path(dir) / name).string();
  return {name, uint64_t(fs::file_size(path)), sha256_file(path), rank};
}

std::string finish_checkpoint_dir(const std::string& root, const std::string& tmp,
                                  const Manifest& manifest, int keep) {
  files::write_file_atomic((fs::path(tmp) / "manifest.json").string(), manifest_to_json(manifest));
  const fs::path final = checkpoint_dir(root, manifest.step);
  publish(tmp, final);
  files::fsync_directory(root);
  prune(root, manifest.step, keep);
  return final.string();
}

TempDirGuard::~TempDirGuard() {
  if (!published && !path.empty()) files::remove_tree(path);
}

}  // namespace detail

std::string checkpoint_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / ("step-" + std::to_string(step))).string();
}

std::string save_checkpoint(const CheckpointOptions& options, const TrainingState& state) {
  return as_c10_error([&] { return save_checkpoint_files(options, state); });
}

Manifest verify_checkpoint(const std::string& dir) {
  Manifest manifest = read_manifest(dir);
  verify_manifest_files(dir, manifest);
  return manifest;
}

Manifest load_checkpoint(const std::string& dir, int world_size, TrainingState& state, int rank) {
  TORCH_CHECK(state.model != nullptr, "ddp: load_checkpoint: TrainingState::model is null");
  const Manifest head = read_manifest(dir);
  // A global batch the caller states is the saved run's: the steps' samples, a schedule's step and
  // the data position all assume it. Refused before any change; a checkpoint that did not record
  // one (0) loads as before.
  TORCH_CHECK(
      state.global_batch == 0 || head.global_batch == 0 || head.global_batch == state.global_batch,
      "ddp: checkpoint ", dir, " was saved by a run of ", head.global_batch,
      " samples a step, this run's is ", state.global_batch,
      " (TrainingState::global_batch): resume with the same global batch (at another "
      "world size, scale the batch per rank)");
  const bool rank_files = std::any_of(head.files.begin(), head.files.end(),
                                      [](const ManifestFile& f) { return f.rank != kReplicated; });
  if (state.split_layouts() != nullptr)
    check_sharding_group("load_checkpoint", *state.split_layouts(), world_size, rank);
  if (state.split_layouts() != nullptr || rank_files || !head.sharded.empty()) {
    // Split state in the run or in the checkpoint: each rank reads (and verifies) only the files
    // holding pieces it needs, onto any mesh.
    return load_resharded_checkpoint(dir, head, state);
  }
  verify_manifest_files(dir, head);
  const Manifest& manifest = head;
  // Whole tensors load at any world size, as PyTorch loads a DDP state dict anywhere: every rank
  // holds all of it. The caller checks that its data
  // position still fits (ddp-train: the same global batch).
  const auto has = [&](const char* name) {
    return std::any_of(manifest.files.begin(), manifest.files.end(),
                       [&](const ManifestFile& f) { return f.name == name; });
  };
  TORCH_CHECK(has(kModelFile) && has(kRngFile), "ddp: checkpoint ", dir, " does not list ",
              kModelFile, " and ", kRngFile, " in its manifest");
  const std::string model_path = (fs::path(dir) / kModelFile).string();
  const std::string optim_path = (fs::path(dir) / kOptimFile).string();
  const std::string rng_path = (fs::path(dir) / kRngFile).string();
  const TensorMap model = load_safetensors(model_path);
  const TensorMap rng = load_safetensors(rng_path);
  // All checks before the first change, so a refused checkpoint leaves the run as it was; the
  // optimizer's state is built aside and swapped in by load_optimizer_tensors.
  check_model_tensors(*state.model, model, model_path);
  check_rng_tensors(rng, rng_path);
  if (state.optimizer != nullptr) {
    const std::string kind = optimizer_kind(*state.optimizer);
    TORCH_CHECK(manifest.optimizer == kind && has(kOptimFile), "ddp: checkpoint ", dir, " holds ",
                manifest.optimizer.empty() ? std::string("no optimizer state")
                                           : "the state of a " + manifest.optimizer + " optimizer",
                " but this run uses ", kind);
    load_optimizer_tensors(*state.optimizer, *state.model, load_safetensors(optim_path),
                           optim_path);
  }
  load_model_tensors(*state.model, model, model_path);
  load_rng_tensors(rng, rng_path);
  state.step = manifest.step;
  state.data_position = manifest.data_position;
  if (state.global_batch == 0) state.global_batch = manifest.global_batch;
  return manifest;
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const auto step = parse_step_name(entry.path().filename().string());
    if (step && entry.is_directory(ec)) out.push_back({*step, entry.path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step > b.step; });
  return out;
}

std::optional<CheckpointEntry> find_latest_checkpoint(const std::string& root, int rank) {
  for (const CheckpointEntry& e : list_checkpoints(root)) {
    try {
      const Manifest m = verify_checkpoint(e.dir);
      TORCH_CHECK(m.step == e.step, "ddp: checkpoint ", e.dir,
                  " is misnamed: its manifest says step ", m.step);
      return e;
    } catch (const c10::Error& err) {
      obs::log(obs::LogLevel::kWarn, rank,
               "ddp: warning: skipping checkpoint " + e.dir + ": " +
                   without_ddp_prefix(err.what_without_backtrace()));
    }
  }
  return std::nullopt;
}

}  // namespace ddp::io
