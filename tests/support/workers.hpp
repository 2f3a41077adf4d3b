#pragma once
// Multi-process tests: the gtest body (the parent) starts N workers of this test binary with
// DDP_TEST_WORKER=<name> and the torchrun environment, each running the named worker instead of
// gtest: forks of the parent on the CPU build (no second libtorch start-up; the default
// generator's seed reset as a fresh process has it), exec'd copies on the GPU build (a fork
// cannot use CUDA). A worker fails by throwing; its message goes to stderr and its exit code is 1.

#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "ddp/comm/process_group.hpp"
#include "ddp/launch/spawn.hpp"

namespace ddp::testing {

using WorkerFn = std::function<void()>;

struct WorkerRegistrar {
  WorkerRegistrar(const std::string& name, WorkerFn fn);
};

#define DDP_TEST_WORKER(name)                                                         \
  static void name##_worker_body();                                                   \
  static ::ddp::testing::WorkerRegistrar name##_registrar(#name, name##_worker_body); \
  static void name##_worker_body()

// Parent side: runs worker `name` on `world` processes and returns how they ended. `env` reaches
// every worker (read it with worker_env). Bounded by `timeout`. The workers' output reaches the
// test's stdout/stderr line by line, prefixed "[rank R] ".
launch::SpawnResult run_workers(const std::string& name, int world,
                                const std::map<std::string, std::string>& env = {},
                                std::chrono::seconds timeout = std::chrono::seconds(180));

// main(): if this process is a worker, runs it and returns its exit code; otherwise -1.
int maybe_run_worker();

// Worker side: a Gloo process group from the environment; every collective bounded by `timeout`.
comm::ProcessGroupPtr worker_process_group(
    std::chrono::milliseconds timeout = std::chrono::seconds(60),
    const std::string& backend = "gloo");
// A value the parent passed through run_workers' env (throws if absent and no fallback).
std::string worker_env(const std::string& key, const std::string& fallback = "\x01");

// Throws with `what` when the condition fails: a worker's assertion.
void require(bool condition, const std::string& what);

}  // namespace ddp::testing
