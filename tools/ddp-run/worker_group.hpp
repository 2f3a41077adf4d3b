#pragma once
// One attempt of ddp-run: start this node's workers, relay their output line by line with a rank
// prefix, and end the whole group when one of them fails, when ddp-run is signalled, or at the job
// deadline. Restarts are the caller's loop (main.cpp): each attempt is a fresh group.
//
// [Note: worker process groups]
// Every worker is the leader of its own process group (setpgid), and the launcher signals the
// group, not the pid:
//  - kill(-pgid) also reaches what the worker started (a shell's children, data-loader
//    processes), which PR_SET_PDEATHSIG alone never reaches;
//  - Ctrl-C at a terminal goes to the foreground process group only, so it reaches ddp-run once
//    and the workers once, through ddp-run's forwarding, instead of everyone at the same time
//    with the launcher's escalation racing the terminal's signal.
// The cost: workers cannot read the terminal (a background group would stop on SIGTTIN), so their
// stdin is /dev/null; and if ddp-run itself is SIGKILLed, PR_SET_PDEATHSIG kills the workers but
// not their own children.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::run {

using Clock = std::chrono::steady_clock;

struct GroupOptions {
  // Program and arguments; argv[0] is looked up in PATH (execvp), as a shell would.
  std::vector<std::string> argv;
  int nproc_per_node = 1;  // local workers; LOCAL_WORLD_SIZE
  int nnodes = 1;          // WORLD_SIZE = nnodes * nproc_per_node
  int node_rank = 0;       // RANK = node_rank * nproc_per_node + LOCAL_RANK; GROUP_RANK
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 0;  // the store's port for this attempt, never 0 here
  int restart_count = 0;     // DDP_RESTART_COUNT: 0 on the first attempt, then 1, 2, ...
  // After SIGTERM (or a forwarded SIGINT), how long the workers get to exit before SIGKILL.
  // Default 10 s, torchrun's: long enough to flush a log, short enough for a user at a terminal.
  std::chrono::milliseconds grace = std::chrono::seconds(10);
  std::optional<Clock::time_point> deadline;  // the whole job's; none by default
};

struct GroupResult {
  enum class Kind {
    kSucceeded,     // every worker exited 0
    kWorkerFailed,  // first_failure names the first worker seen failing
    kSignalled,     // ddp-run got `signal`; it was forwarded to every worker
    kTimedOut,      // the job deadline passed
  };
  Kind kind = Kind::kSucceeded;
  int signal = 0;  // kSignalled: the signal ddp-run received
  struct Failure {
    int rank = 0;
    bool signaled = false;
    int code = 0;  // exit code, or the signal number when signaled
  };
  std::optional<Failure> first_failure;
};

// Installs ddp-run's handlers for SIGINT, SIGTERM, SIGHUP and SIGCHLD. Call once, before the
// first run_worker_group.
void install_signal_handlers();

// The signal ddp-run has received (0 if none): once set, no new group must be started.
int received_signal();

// Runs one attempt to completion; every worker has been reaped when it returns. Reports the first
// failure on stderr as "ddp-run: rank R exited with code C" / "... was killed by signal S (...)".
GroupResult run_worker_group(const GroupOptions& options);

}  // namespace ddp::run
