#include "ddp/launch/spawn.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>
#include <thread>

namespace ddp::launch {

bool SpawnResult::ok() const {
  if (timed_out) return false;
  for (const auto& w : workers) {
    if (w.signaled || w.exit_code != 0) return false;
  }
  return true;
}

std::string SpawnResult::describe() const {
  std::ostringstream out;
  if (timed_out) out << "timed out; ";
  for (const auto& w : workers) {
    out << "rank " << w.rank;
    if (w.signaled) {
      out << " killed by signal " << w.signal << " (" << strsignal(w.signal) << ")";
    } else {
      out << " exited with code " << w.exit_code;
    }
    if (w.killed_by_launcher) out << " [stopped by the launcher]";
    out << "; ";
  }
  return out.str();
}

std::string self_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  TORCH_CHECK(n > 0, "ddp: cannot read /proc/self/exe: ", std::strerror(errno));
  buf[n] = '\0';
  return buf;
}

namespace {

[[noreturn]] void exec_worker(const SpawnOptions& options, int rank, uint16_t port,
                              pid_t launcher) {
  // Die with the launcher: no orphan survives a killed ddp-train or test binary.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl took effect
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  for (const auto& [k, v] : options.env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> args;
  for (const auto& a : options.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  const std::string msg =
      "ddp: exec of " + options.argv[0] + " failed: " + std::strerror(errno) + "\n";
  (void)!::write(2, msg.data(), msg.size());
  ::_exit(127);
}

}  // namespace

SpawnResult spawn_local_workers(const SpawnOptions& options) {
  TORCH_CHECK(options.nproc >= 1, "ddp: --nproc must be at least 1, got ", options.nproc);
  TORCH_CHECK(!options.argv.empty(), "ddp: spawn_local_workers needs a program to run");
  const uint16_t port = options.master_port ? options.master_port : find_free_port();
  const pid_t self = ::getpid();

  SpawnResult result;
  std::vector<pid_t> pids(options.nproc, -1);
  result.workers.resize(options.nproc);
  for (int r = 0; r < options.nproc; ++r) {
    result.workers[r].rank = r;
    const pid_t pid = ::fork();
    TORCH_CHECK(pid >= 0, "ddp: fork failed: ", std::strerror(errno));
    if (pid == 0) exec_worker(options, r, port, self);
    pids[r] = pid;
  }

  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + options.timeout;
  std::optional<Clock::time_point> kill_at;  // set at the first failure
  bool terminated = false;
  int running = options.nproc;
  auto signal_all = [&](int sig) {
    for (int r = 0; r < options.nproc; ++r) {
      if (pids[r] > 0) {
        ::kill(pids[r], sig);
        result.workers[r].killed_by_launcher = true;
      }
    }
  };
  while (running > 0) {
    bool reaped = false;
    for (int r = 0; r < options.nproc; ++r) {
      int status = 0;
      // Only our own workers: waitpid(-1) would reap children of the host program too.
      if (pids[r] <= 0 || ::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      pids[r] = -1;
      --running;
      reaped = true;
      WorkerExit& w = result.workers[r];
      w.signaled = WIFSIGNALED(status);
      w.signal = w.signaled ? WTERMSIG(status) : 0;
      w.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      if ((w.signaled || w.exit_code != 0) && !kill_at) kill_at = Clock::now() + options.grace;
    }
    if (reaped) continue;
    const auto now = Clock::now();
    if (now >= deadline && !result.timed_out) {
      result.timed_out = true;
      signal_all(SIGKILL);
    } else if (kill_at && now >= *kill_at) {
      signal_all(terminated ? SIGKILL : SIGTERM);
      kill_at = now + std::chrono::seconds(2);
      terminated = true;
    }
    // Polling, not synchronisation: waitpid has no timeout, and a SIGCHLD handler would take the
    // signal from a host program (a test binary, a user's trainer).
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return result;
}

}  // namespace ddp::launch
