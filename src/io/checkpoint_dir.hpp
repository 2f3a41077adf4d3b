#pragma once
// The directory protocol of a checkpoint save (checkpoint.hpp), in the pieces that the saves
// share: one process's (save_checkpoint) and the ranks' (every rank writes its files, none when it
// holds nothing split, into rank 0's temporary directory: checkpoint_coordinator.cpp and the
// background save). Private to src/io.
//
//   start_checkpoint_dir    <root> exists, dead writers' .tmp-step-* removed, <tmp> fresh
//   ... the files, each written atomically (fsynced) by whoever owns it; describe_file each
//   finish_checkpoint_dir   manifest.json last, rename <tmp> -> step-<N>, fsync <root>, prune

#include <cstdint>
#include <string>

#include "ddp/io/checkpoint_manifest.hpp"

namespace ddp::io::detail {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimFile = "optim.safetensors";
constexpr const char* kRngFile = "rng.safetensors";

// "<root>/.tmp-step-<step>-<pid>": where process `pid` writes step `step` before publishing it.
// The pid tells a later save whether the writer still runs (remove_stale_temporaries).
std::string temp_checkpoint_dir(const std::string& root, int64_t step, int64_t pid);

// Creates `root` if needed, removes the temporary directories of writers that no longer run, and
// makes `tmp` a fresh empty directory. Throws c10::Error naming the directory.
void start_checkpoint_dir(const std::string& root, const std::string& tmp);

// The manifest entry of `dir`/`name` as it is on disk: size and SHA-256 (the file is already
// fsynced by its atomic write), and the rank whose state it holds (kReplicated: every rank's).
ManifestFile describe_file(const std::string& dir, const std::string& name, int rank);

// Writes `manifest` into `tmp` last, renames `tmp` to <root>/step-<manifest.step> (replacing an
// existing one atomically), fsyncs `root`, then deletes older checkpoints beyond `keep`. Returns
// the final directory.
std::string finish_checkpoint_dir(const std::string& root, const std::string& tmp,
                                  const Manifest& manifest, int keep);

// Removes a temporary directory on every exit but a published one: a half-written checkpoint
// never outlives its save.
struct TempDirGuard {
  std::string path;  // "" guards nothing (ranks that do not own the directory)
  bool published = false;
  ~TempDirGuard();
};

}  // namespace ddp::io::detail
