#include "ddp/obs/log.hpp"

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>

namespace ddp::obs {

namespace {

LogLevel level_from_env() {
  const char* text = std::getenv("DDP_LOG_LEVEL");
  if (text == nullptr) return LogLevel::kWarn;
  const std::string value(text);
  if (value == "error") return LogLevel::kError;
  if (value == "info") return LogLevel::kInfo;
  if (value == "debug") return LogLevel::kDebug;
  return LogLevel::kWarn;
}

std::atomic<int>& current_level() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(current_level().load()); }

void set_log_level(LogLevel level) { current_level() = static_cast<int>(level); }

void log(LogLevel level, int rank, const std::string& message) {
  if (static_cast<int>(level) > current_level().load()) return;
  static std::mutex mutex;  // keeps lines from interleaving
  std::lock_guard<std::mutex> lock(mutex);
  std::cerr << "[ddp rank " << rank << "] " << message
            << (!message.empty() && message.back() == '\n' ? "" : "\n") << std::flush;
}

}  // namespace ddp::obs
