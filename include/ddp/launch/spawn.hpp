#pragma once
// Spawning N local workers on loopback: the small launcher that ddp-train --nproc and the
// multi-process tests share. Each worker is `argv` run with the torchrun environment (RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>).

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ddp::launch {

struct SpawnOptions {
  int nproc = 2;                  // workers to start; default 2, the README's main job
  std::vector<std::string> argv;  // program and arguments; argv[0] is a path (no PATH lookup)
  // Extra environment for every worker (e.g. a test's worker name), on top of the inherited one.
  std::map<std::string, std::string> env;
  // Whole-job bound. Default 10 minutes; tests pass less. On expiry every worker is killed.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // After the first failure, how long the others get to exit on their own (they usually fail
  // fast through their collective timeout) before SIGTERM, then SIGKILL. Default 10 s.
  std::chrono::milliseconds grace = std::chrono::seconds(10);
  uint16_t master_port = 0;  // 0: pick a free loopback port
};

struct WorkerExit {
  int rank = 0;
  int exit_code = -1;  // valid when !signaled
  int signal = 0;      // the signal that ended it, when signaled
  bool signaled = false;
  bool killed_by_launcher = false;  // the launcher ended it (timeout or another rank failed)
};

struct SpawnResult {
  std::vector<WorkerExit> workers;  // by rank
  bool timed_out = false;
  bool ok() const;               // every worker exited 0 and no timeout
  std::string describe() const;  // "rank 1 exited with code 3; ..." for error messages
};

// Starts the workers, waits for all of them (bounded by options.timeout), and never leaves one
// behind: workers die with the launcher (PR_SET_PDEATHSIG) and are killed on timeout.
SpawnResult spawn_local_workers(const SpawnOptions& options);

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
uint16_t find_free_port();

// Path of the running executable (/proc/self/exe), for re-executing self as a worker.
std::string self_executable();

}  // namespace ddp::launch
