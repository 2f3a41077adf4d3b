#include "ddp/launch/spawn.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ddp/files/posix_file.hpp"

namespace ddp::launch {

bool SpawnResult::ok() const {
  if (timed_out || signal != 0) return false;
  for (const auto& w : workers) {
    if (w.signaled || w.exit_code != 0) return false;
  }
  return true;
}

int SpawnResult::exit_code() const {
  if (signal != 0) return 128 + signal;
  return ok() ? 0 : 1;
}

std::string SpawnResult::describe() const {
  std::vector<std::string> parts;
  if (timed_out) parts.push_back("timed out");
  if (signal != 0) {
    parts.push_back("signal " + std::to_string(signal) + " (" + strsignal(signal) + ") forwarded");
  }
  for (const auto& w : workers) {
    std::string part = "rank " + std::to_string(w.rank);
    if (w.signaled) {
      part += " killed by signal " + std::to_string(w.signal) + " (" + strsignal(w.signal) + ")";
    } else {
      part += " exited with code " + std::to_string(w.exit_code);
    }
    if (w.killed_by_launcher) part += " [stopped by the launcher]";
    parts.push_back(part);
  }
  std::string out;
  for (const auto& part : parts) out += (out.empty() ? "" : "; ") + part;
  return out;
}

std::string self_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) {
    throw std::runtime_error(std::string("ddp: cannot read /proc/self/exe: ") +
                             std::strerror(errno));
  }
  buf[n] = '\0';
  return buf;
}

SpawnResult spawn_local_workers(const SpawnOptions& options) {
  if (options.nproc < 1) {
    throw std::invalid_argument("ddp: --nproc must be at least 1, got " +
                                std::to_string(options.nproc));
  }
  if (options.argv.empty()) {
    throw std::invalid_argument("ddp: spawn_local_workers needs a program to run");
  }
  WorkerGroupOptions group;
  group.argv = options.argv;
  group.nproc_per_node = options.nproc;
  group.master_port = options.master_port;
  group.env = options.env;
  group.restart_count = options.restart_count;
  group.max_restarts = options.max_restarts;
  group.min_nproc = options.min_nproc;
  group.grace = options.grace;
  group.timeout = options.timeout;
  group.timeout_source = "the job timeout";
  group.relay_output = options.relay_output;
  group.prefix_rank0_stdout = options.prefix_rank0_stdout;
  group.forward_signals = options.forward_signals;
  group.name = options.name;
  group.fork_main = options.fork_main;
  const GroupResult r = run_worker_group(group);
  SpawnResult result;
  result.workers = r.workers;
  result.timed_out = r.kind == GroupResult::Kind::kTimedOut;
  result.signal = r.kind == GroupResult::Kind::kSignalled ? r.signal : 0;
  return result;
}

int run_self_as_workers(int argc, char** argv, const std::string& marker, SpawnOptions options) {
  options.argv = {self_executable()};
  for (int i = 1; i < argc; ++i) options.argv.push_back(argv[i]);
  options.env[marker] = "1";
  const SpawnResult result = spawn_local_workers(options);
  if (!result.ok()) {
    std::string line = options.name + ": workers failed: " + result.describe();
    if (!options.flight_recorder_dir.empty()) {
      line += "; flight recorder dumps in " + options.flight_recorder_dir + " (ddp-forensics " +
              options.flight_recorder_dir + " names the first divergence)";
    }
    line += "\n";
    (void)files::write_all(STDERR_FILENO, line.data(), line.size());
  }
  return result.exit_code();
}

}  // namespace ddp::launch
