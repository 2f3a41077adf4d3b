#pragma once
// The one launcher of libddp: ddp-run, the tools' --nproc (spawn.hpp) and the multi-process tests
// all start their workers here. A WorkerGroup starts this node's workers with the torchrun
// environment, relays their output line by line with a "[rank R] " prefix, ends the whole group
// when one worker fails, when the launcher is signalled, or at the job deadline, and restarts it
// up to max_restarts times (each attempt a fresh group, DDP_RESTART_COUNT counting up).
//
// Every worker gets the launcher's environment with these set (torchrun's names):
//   RANK = node_rank * nproc_per_node + LOCAL_RANK, LOCAL_RANK, WORLD_SIZE = nnodes *
//   nproc_per_node, LOCAL_WORLD_SIZE = nproc_per_node, GROUP_RANK = node_rank, MASTER_ADDR,
//   MASTER_PORT, DDP_RESTART_COUNT (restart_count + attempt), DDP_LAUNCHER_FD (the launcher
//   channel, comm/launcher_channel.hpp), DDP_STARTED_WORLD_SIZE (the first attempt's WORLD_SIZE; a
//   later one may be smaller under min_nproc), OMP_NUM_THREADS=1 when more than one
//   worker runs here and it is not set already (as torchrun: N workers each using every core
//   oversubscribe the machine N times), plus WorkerGroupOptions::env.
//
// Stopping: SIGTERM (or the signal the launcher received) to every worker, SIGKILL after `grace`;
// a second SIGINT/SIGTERM/SIGHUP to the launcher kills at once.
//
// [Note: worker process groups]
// Every worker is the leader of its own process group (setpgid), and the launcher signals the
// group, not the pid:
//  - kill(-pgid) also reaches what the worker started (a shell's children, data-loader
//    processes), which PR_SET_PDEATHSIG alone never reaches;
//  - Ctrl-C at a terminal goes to the foreground process group only, so it reaches the launcher
//    once and the workers once, through the launcher's forwarding, instead of everyone at the same
//    time with the launcher's escalation racing the terminal's signal.
// The cost: workers cannot read the terminal (a background group would stop on SIGTTIN), so their
// stdin is /dev/null; and if the launcher itself is SIGKILLed, PR_SET_PDEATHSIG kills the workers
// but not their own children.
//
// Torch-free (the ddp_launch library): ddp-run links it without libtorch, for its start-up time.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launch {

using Clock = std::chrono::steady_clock;

struct WorkerGroupOptions {
  // Program and arguments; argv[0] is looked up in PATH (execvp) unless it holds a '/', as a shell
  // would. Required.
  std::vector<std::string> argv;
  int nproc_per_node = 1;                 // local workers, LOCAL_WORLD_SIZE; default 1, torchrun's
  int nnodes = 1;                         // WORLD_SIZE = nnodes * nproc_per_node; default 1
  int node_rank = 0;                      // this node's index, GROUP_RANK; default 0
  std::string master_addr = "127.0.0.1";  // rank 0's store; default loopback (one node)
  // Rank 0's store port. Default 0: a free loopback port, a fresh one per attempt (the failed
  // attempt's store may still hold its own, or TIME_WAIT it); required when nnodes > 1.
  uint16_t master_port = 0;
  // Extra variables for every worker (a test's worker name, a tool's worker marker), on top of the
  // inherited environment; they cannot replace the launcher variables above. Default none.
  std::map<std::string, std::string> env;
  // Restarts of the whole group after a worker failed; default 0 (torchrun's). Never after a
  // signal or the job deadline, nor after the same failure at the same step as the attempt before
  // (a restart loop; the step from the launcher channel, comm/launcher_channel.hpp).
  int max_restarts = 0;
  // The fewest workers to go on with. Default 0: never fewer than nproc_per_node. Otherwise a
  // worker that fails at start-up (before it joined its group: its device is gone) has its slot
  // dropped, and the next attempt runs the others as a smaller world (RANK, LOCAL_RANK and
  // WORLD_SIZE renumbered, CUDA_VISIBLE_DEVICES naming the slots left), as long as at least
  // min_nproc remain. One node only.
  int min_nproc = 0;
  // DDP_RESTART_COUNT of the first attempt; attempt k gets restart_count + k. Default 0; a tool
  // that runs under a restarting launcher passes its own count on.
  int restart_count = 0;
  // After SIGTERM (or a forwarded signal), how long the workers get to exit before SIGKILL.
  // Default 10 s, torchrun's: long enough to flush a log, short enough for a user at a terminal.
  std::chrono::milliseconds grace = std::chrono::seconds(10);
  // Bound on the whole job, restarts included; default none.
  std::optional<std::chrono::milliseconds> timeout;
  // What set `timeout`, named in "timed out (<timeout_source>)"; default ddp-run's flag.
  std::string timeout_source = "--job-timeout-s";
  // The workers' stdout/stderr go through pipes to ours, whole lines with "[rank R] " in front.
  // Default true. False: they write to our stdout/stderr directly (for output that a program
  // parses line by line and that only rank 0 writes, e.g. ddp-bench's result lines).
  bool relay_output = true;
  // With relay_output: false sends rank 0's stdout out as written, unprefixed (a machine-readable
  // stream, ddp-train --json's lines); every other stream keeps its prefix. Default true.
  bool prefix_rank0_stdout = true;
  // Install handlers for SIGINT, SIGTERM and SIGHUP that forward the signal to the workers and
  // stop the group (and SIGCHLD, to wake at a worker's exit). Default true, for launcher programs.
  // A host that must keep its own signal handling (a test binary: Ctrl-C must still end it) says
  // false; its workers still die with it (PR_SET_PDEATHSIG).
  bool forward_signals = true;
  // The launcher's name in front of its own lines ("ddp-run: rank 1 exited with code 3").
  std::string name = "ddp-run";
  // Unset (default): each worker execs argv. Set: each worker is a fork of the launcher that
  // runs this function (with the worker's environment and streams in place, its return value the
  // exit code) and never returns into the launcher's code. For a program that is its own worker:
  // it starts without loading itself again (Debian's libtorch takes ~0.7 s of CPU to start, more
  // than most test bodies run). Only where the launcher holds no CUDA context and no other
  // thread holds a lock the function needs (a fork keeps only the calling thread): the CPU test
  // binary. argv still names the workers in messages. The launcher sets its own BLAS and OpenMP
  // threads to the workers' OMP_NUM_THREADS before it forks ([Note: a forked worker's threads]).
  std::function<int()> fork_main;
};

struct WorkerExit {
  int rank = 0;
  int exit_code = -1;  // valid when !signaled
  int signal = 0;      // the signal that ended it, when signaled
  bool signaled = false;
  bool killed_by_launcher = false;  // it was still running when the launcher stopped the group
  int slot = 0;        // the local slot it ran in (its LOCAL_RANK unless slots were dropped)
  bool ready = false;  // it had joined its group (launcher channel's "ready")
  int64_t step = -1;   // the last step it reported (launcher channel); -1: none
};

// "rank 1 exited with code 3 at step 5", "rank 0 was killed by signal 9 (Killed)".
std::string describe_exit(const WorkerExit& exit);

struct GroupResult {
  enum class Kind {
    kSucceeded,     // every worker exited 0
    kWorkerFailed,  // first_failure names the first worker seen failing (the last attempt's)
    kSignalled,     // the launcher got `signal`; it was forwarded to every worker
    kTimedOut,      // the job deadline passed
  };
  Kind kind = Kind::kSucceeded;
  int signal = 0;  // kSignalled: the signal the launcher received
  std::optional<WorkerExit> first_failure;
  std::vector<WorkerExit> workers;  // the last attempt's, by local rank
  int restarts = 0;                 // attempts made after the first
  bool restart_loop = false;        // stopped restarting: the same failure twice at one step

  // What a launcher process exits with: 0, 128 + signal (as a shell reports a command killed by
  // that signal), or 1.
  int exit_code() const;
};

// Runs the group, restarts included, to completion: every worker has been reaped when it returns.
// Reports on stderr, each line prefixed with options.name: the first failure of an attempt
// ("rank R exited with code C" / "rank R was killed by signal S (name)"), a signal received
// ("got signal S (name); forwarding it to the workers"), the deadline ("timed out (<source>);
// stopping the workers"), each restart with its cause ("restarting the group (restart k of N)
// after rank 1 exited with code 3 at step 5"), a dropped slot and a restart loop.
// Throws std::invalid_argument for unusable options and std::runtime_error when fork/pipe fail.
GroupResult run_worker_group(const WorkerGroupOptions& options);

// The signal the launcher has received since forwarding was installed (0 if none).
int received_signal();

}  // namespace ddp::launch
