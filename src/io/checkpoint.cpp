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
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/io/posix_file.hpp"
#include "ddp/io/safetensors.hpp"
#include "ddp/io/sha256.hpp"
#include "ddp/obs/log.hpp"

namespace ddp::io {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimFile = "optim.safetensors";
constexpr const char* kRngFile = "rng.safetensors";
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
    remove_tree(entry.path().string());
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
    remove_tree(tmp.string());  // now the old checkpoint
    return;
  }
  // File systems without RENAME_EXCHANGE: move the old one aside first. A crash in between
  // leaves no step-<N>, and the older checkpoints stay as they were.
  const fs::path aside = fs::path(tmp).concat(".old");
  TORCH_CHECK(::rename(final.c_str(), aside.c_str()) == 0, "ddp: checkpoint: moving ", final,
              " aside failed: ", std::strerror(errno));
  TORCH_CHECK(::rename(tmp.c_str(), final.c_str()) == 0, "ddp: checkpoint: renaming ", tmp, " to ",
              final, " failed: ", std::strerror(errno));
  remove_tree(aside.string());
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
    if (const int err = remove_tree(e.dir)) {
      obs::log(
          obs::LogLevel::kWarn, 0,
          "ddp: warning: could not delete old checkpoint " + e.dir + ": " + std::strerror(err));
    }
  }
}

std::string without_ddp_prefix(std::string text) {
  const std::string p = "ddp: ";
  if (text.rfind(p, 0) == 0) text.erase(0, p.size());
  return text;
}

// save_checkpoint's body; FileErrors from it become c10::Errors there.
std::string save_checkpoint_files(const CheckpointOptions& options, const TrainingState& state) {
  TORCH_CHECK(!options.root.empty(), "ddp: save_checkpoint: CheckpointOptions::root is empty");
  TORCH_CHECK(state.model != nullptr, "ddp: save_checkpoint: TrainingState::model is null");
  TORCH_CHECK(state.step >= 0, "ddp: save_checkpoint: step ", state.step, " is negative");
  TORCH_CHECK(options.keep >= 0, "ddp: save_checkpoint: keep ", options.keep,
              " is negative (0 keeps every checkpoint)");
  if (options.rank != 0) return "";  // replicated state: rank 0's copy is the checkpoint

  const fs::path root(options.root);
  std::error_code ec;
  fs::create_directories(root, ec);
  TORCH_CHECK(!ec, "ddp: checkpoint: cannot create directory ", root, ": ", ec.message());
  remove_stale_temporaries(root);

  const fs::path tmp =
      root / (kTmpPrefix + std::to_string(state.step) + "-" + std::to_string(::getpid()));
  // Removed on every failure: a half-written checkpoint never outlives its save.
  struct TmpDir {
    fs::path path;
    bool published = false;
    ~TmpDir() {
      if (!published) remove_tree(path.string());
    }
  } guard{tmp};
  remove_tree(tmp.string());
  fs::create_directory(tmp, ec);
  TORCH_CHECK(!ec, "ddp: checkpoint: cannot create directory ", tmp, ": ", ec.message());

  Manifest manifest;
  manifest.step = state.step;
  manifest.data_position = state.data_position;
  manifest.world_size = options.world_size;
  const std::map<std::string, std::string> meta = {{"format", "ddp-checkpoint"},
                                                   {"step", std::to_string(state.step)}};
  std::vector<std::string> files = {kModelFile};
  save_safetensors((tmp / kModelFile).string(), model_tensors(*state.model), meta);
  if (state.optimizer != nullptr) {
    manifest.optimizer = optimizer_kind(*state.optimizer);
    save_safetensors((tmp / kOptimFile).string(), optimizer_tensors(*state.optimizer, *state.model),
                     meta);
    files.push_back(kOptimFile);
  }
  save_safetensors((tmp / kRngFile).string(), rng_tensors(), meta);
  files.push_back(kRngFile);
  // Sizes and checksums of the bytes as they are on disk (each file is fsynced already).
  for (const std::string& name : files) {
    const std::string path = (tmp / name).string();
    manifest.files.push_back({name, uint64_t(fs::file_size(path)), sha256_file(path), kReplicated});
  }
  write_file_atomic((tmp / "manifest.json").string(), manifest_to_json(manifest));

  const fs::path final = checkpoint_dir(options.root, state.step);
  publish(tmp, final);
  guard.published = true;
  fsync_directory(root.string());
  prune(options.root, state.step, options.keep);
  return final.string();
}

}  // namespace

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

Manifest load_checkpoint(const std::string& dir, int world_size, TrainingState& state) {
  TORCH_CHECK(state.model != nullptr, "ddp: load_checkpoint: TrainingState::model is null");
  const Manifest manifest = verify_checkpoint(dir);
  TORCH_CHECK(manifest.world_size == world_size, "ddp: checkpoint ", dir,
              " was written at world size ", manifest.world_size, " but this run has world size ",
              world_size,
              "; resuming at a different world size is not supported yet (checkpoints are not "
              "sharded): run with ",
              manifest.world_size, " processes, or start without resuming");
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
