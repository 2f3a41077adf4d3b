#pragma once
// The one place libddp writes to the terminal. Quiet by default; DDP_LOG_LEVEL=info (or a tool's
// --verbose) shows bucket tables and stats.

#include <string>

namespace ddp::obs {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// The level from DDP_LOG_LEVEL (error|warn|info|debug), default warn; set_log_level overrides it.
LogLevel log_level();
void set_log_level(LogLevel level);

// Writes "[ddp rank R] message" to stderr when `level` is enabled.
void log(LogLevel level, int rank, const std::string& message);

}  // namespace ddp::obs
