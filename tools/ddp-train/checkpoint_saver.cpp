#include "checkpoint_saver.hpp"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

namespace ddp::tools {
namespace {

std::string milliseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f ms", seconds * 1e3);
  return text;
}

std::string mebibytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / (1 << 20));
  return text;
}

}  // namespace

CheckpointSaver::CheckpointSaver(comm::ProcessGroup& group, const io::CoordinatorOptions& options,
                                 bool async, bool lead)
    : group_(group), options_(options), lead_(lead) {
  if (!async) return;
  io::AsyncCheckpointerOptions o;
  o.coordinator = options;
  async_ = std::make_unique<io::AsyncCheckpointer>(group, o);
}

void CheckpointSaver::save(const io::TrainingState& state) {
  if (!async_) {
    const auto start = std::chrono::steady_clock::now();
    // Returns on every rank once the checkpoint is complete on disk.
    const std::string dir = io::save_and_barrier(group_, options_, state);
    const double blocked =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (lead_) {
      std::cout << "ddp-train: checkpoint " << dir << " saved (the step blocked "
                << milliseconds(blocked) << ")" << std::endl;
    }
    return;
  }
  const io::AsyncSaveStart start = async_->save(state);
  if (lead_) {
    std::cout << "ddp-train: checkpoint step-" << start.step << " copied to host memory ("
              << mebibytes(start.staged_bytes) << "; the step blocked "
              << milliseconds(start.blocked_s);
    if (start.waited_s > 0)
      std::cout << ", of which " << milliseconds(start.waited_s) << " waiting for the save before";
    std::cout << "), written in the background" << std::endl;
  }
}

void CheckpointSaver::poll() {
  if (!async_) return;
  const std::optional<io::AsyncSaveEnd> end = async_->poll();
  if (!end || !lead_ || !end->error.empty()) return;
  std::cout << "ddp-train: checkpoint " << end->dir << " saved in the background (written in "
            << milliseconds(end->written_s) << ")" << std::endl;
}

void CheckpointSaver::finish() {
  if (!async_) return;
  poll();  // a save that landed already is said as every other; wait() names only another
  const std::string dir = async_->wait();
  if (lead_ && !dir.empty()) {
    std::cout << "ddp-train: checkpoint " << dir << " saved in the background" << std::endl;
  }
}

}  // namespace ddp::tools
