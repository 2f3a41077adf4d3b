#pragma once
// Spawning N local workers on loopback: the small API that ddp-train --nproc, ddp-bench --nproc
// and the multi-process tests share, over the one WorkerGroup (worker_group.hpp). Each worker is
// `argv` run with the environment ddp-run gives (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>, GROUP_RANK=0, DDP_RESTART_COUNT,
// OMP_NUM_THREADS=1 unless set), its output lines prefixed with "[rank R] ", and the same
// stopping: the first failure sends SIGTERM to the others, SIGKILL follows after `grace`.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ddp/launch/free_port.hpp"
#include "ddp/launch/worker_group.hpp"

namespace ddp::launch {

struct SpawnOptions {
  int nproc = 2;                  // workers to start; default 2, the README's main job
  std::vector<std::string> argv;  // program and arguments; argv[0] is a path (self_executable())
  // Extra environment for every worker (e.g. a test's worker name), on top of the inherited one.
  std::map<std::string, std::string> env;
  // Whole-job bound. Default 10 minutes; tests pass less. On expiry every worker is stopped.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // After the first failure (or the timeout, or a signal), how long the others get between
  // SIGTERM and SIGKILL. Default 10 s, as ddp-run's --grace-s.
  std::chrono::milliseconds grace = std::chrono::seconds(10);
  uint16_t master_port = 0;  // 0: pick a free loopback port
  // DDP_RESTART_COUNT the workers see. Default 0 (nothing restarts them); a tool running under a
  // restarting launcher passes that launcher's count on.
  int restart_count = 0;
  // As WorkerGroupOptions (the tools' --max-restarts, --min-nproc): restarts of every worker after
  // one failed (default 0), and the fewest workers to go on with when a slot fails at start-up
  // (default 0: never fewer).
  int max_restarts = 0;
  int min_nproc = 0;
  // As WorkerGroupOptions: "[rank R] " prefixes (default), forwarding of SIGINT/SIGTERM/SIGHUP
  // (default; a test binary says false), and the name in front of the launcher's own lines.
  bool relay_output = true;
  bool prefix_rank0_stdout = true;  // as WorkerGroupOptions
  bool forward_signals = true;
  std::string name = "ddp";
  // Where the workers' flight recorder dumps go (--flight-recorder), said when the job fails;
  // "" (default): nothing said.
  std::string flight_recorder_dir;
  // As WorkerGroupOptions::fork_main: unset (default) execs argv; set, each worker is a fork of
  // this process running it.
  std::function<int()> fork_main;
};

struct SpawnResult {
  std::vector<WorkerExit> workers;  // by rank
  bool timed_out = false;
  int signal = 0;                // the signal the launcher received and forwarded, 0 if none
  bool ok() const;               // every worker exited 0, no timeout, no signal
  std::string describe() const;  // "rank 1 exited with code 3; ..." for error messages
  int exit_code() const;         // what the launcher should exit with: 0, 128 + signal, or 1
};

// Starts the workers, waits for all of them (bounded by options.timeout), and never leaves one
// behind: workers die with the launcher (PR_SET_PDEATHSIG) and are stopped on timeout. Throws
// std::invalid_argument for nproc < 1 ("ddp: --nproc must be at least 1, got 0").
SpawnResult spawn_local_workers(const SpawnOptions& options);

// Path of the running executable (/proc/self/exe), for re-executing self as a worker.
std::string self_executable();

// A tool's --nproc: runs this program again as options.nproc workers, with the same arguments
// (argv[1..]) and `marker`=1 in their environment (the worker's cue to run instead of spawning);
// options.argv is filled here. On failure says "<name>: workers failed: <describe()>" on stderr.
// Returns what the tool should exit with (SpawnResult::exit_code).
int run_self_as_workers(int argc, char** argv, const std::string& marker, SpawnOptions options);

}  // namespace ddp::launch
