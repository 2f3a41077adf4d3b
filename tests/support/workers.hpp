#pragma once
// Multi-process tests: the gtest body (the parent) starts N workers of this test binary with
// DDP_TEST_WORKER=<name>, its Case (support/worker_case.hpp) and the torchrun environment, each
// running the named worker instead of gtest: forks of the parent on the CPU build (no second
// libtorch start-up; the default generator's seed reset as a fresh process has it), exec'd copies
// on the GPU build (a fork cannot use CUDA). A worker fails by throwing; its message goes to stderr
// and its exit code is 1.

#include <chrono>
#include <functional>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "ddp/comm/init.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/launch/spawn.hpp"
#include "support/param_names.hpp"
#include "support/worker_case.hpp"

namespace ddp::testing {

// Registers a worker's body under its name (what DDP_TEST_WORKER_WITH's handle does): the body
// reads its Case from the encoded text the parent passed.
void register_worker(const std::string& name, std::function<void(const std::string&)> body);

// A registered worker: run_workers takes it and the Case its body is declared with, so a test
// cannot start a worker that does not exist or hand it parameters of another shape.
template <class Case>
class Worker {
 public:
  using Body = void (*)(const Case&);
  Worker(const char* name, Body body) : name_(name) {
    register_worker(name_,
                    [body](const std::string& text) { body(detail::decode_case<Case>(text)); });
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// DDP_TEST_WORKER_WITH(resume, ResumeCase, c) { ... c.style ... } defines the worker `resume`,
// whose body sees the Case the parent gave run_workers; DDP_TEST_WORKER(name) one without.
#define DDP_TEST_WORKER_WITH(name, Case, param)                              \
  static void name##_worker_body(const Case& param);                         \
  static const ::ddp::testing::Worker<Case> name(#name, name##_worker_body); \
  static void name##_worker_body(const Case& param)
#define DDP_TEST_WORKER(name) DDP_TEST_WORKER_WITH(name, ::ddp::testing::NoCase, )

namespace detail {
launch::SpawnResult run_worker_processes(const std::string& name, int world,
                                         const std::string& case_text,
                                         const std::map<std::string, std::string>& env,
                                         std::chrono::seconds timeout);
}  // namespace detail

// Parent side: runs `worker` on `world` processes with `c` and returns how they ended. `env` is
// for what the library itself reads from the environment (DDP_FLIGHT_RECORDER_DIR, NCCL_*), not
// for the test's parameters. Bounded by `timeout`. The workers' output reaches the test's
// stdout/stderr line by line, prefixed "[rank R] ".
template <class Case>
launch::SpawnResult run_workers(const Worker<Case>& worker, int world, const Case& c = {},
                                const std::map<std::string, std::string>& env = {},
                                std::chrono::seconds timeout = std::chrono::seconds(180)) {
  return detail::run_worker_processes(worker.name(), world, detail::encode_case(c), env, timeout);
}

// Expects every worker of a run (a launch::SpawnResult) to have passed; on failure says how each
// ended.
#define EXPECT_WORKERS_PASS(...)                                   \
  do {                                                             \
    const ::ddp::launch::SpawnResult ddp_workers_ = (__VA_ARGS__); \
    EXPECT_TRUE(ddp_workers_.ok()) << ddp_workers_.describe();     \
  } while (false)

// A parameterised suite over world sizes, DDP_WORLD_SUITE(Unused, 1, 2, 3), whose tests
// DDP_WORKER_TEST_P(Unused, FindsTheBranch, unused_branch) each run a worker (without a Case) on
// that many ranks and expect every rank to pass: Unused.FindsTheBranch/world1 ... /world3.
#define DDP_WORLD_SUITE(Suite, ...)                                           \
  class Suite : public ::testing::TestWithParam<int> {};                      \
  INSTANTIATE_TEST_SUITE_P(WorldSizes, Suite, ::testing::Values(__VA_ARGS__), \
                           ::ddp::testing::world_name)
#define DDP_WORKER_TEST_P(Suite, Name, worker) \
  TEST_P(Suite, Name) { EXPECT_WORKERS_PASS(::ddp::testing::run_workers(worker, GetParam())); }
// The suite of one such test.
#define DDP_WORKER_TEST_PER_WORLD(Suite, Name, worker, ...) \
  DDP_WORLD_SUITE(Suite, __VA_ARGS__);                      \
  DDP_WORKER_TEST_P(Suite, Name, worker)

// One test over a parameterised suite of Cases (each with a `world` member): runs `worker` on
// c.world ranks with c. The suite's INSTANTIATE_TEST_SUITE_P names the cases.
#define DDP_WORKER_CASE_TEST(Suite, Name, worker, Case)                   \
  class Suite : public ::testing::TestWithParam<Case> {};                 \
  TEST_P(Suite, Name) {                                                   \
    const Case& c = GetParam();                                           \
    EXPECT_WORKERS_PASS(::ddp::testing::run_workers(worker, c.world, c)); \
  }

// main(): if this process is a worker, runs it and returns its exit code; otherwise -1.
int maybe_run_worker();

// Worker side: a process group from the environment (Gloo unless `backend` says otherwise; `nccl`:
// NCCL's communicator options); every collective bounded by `timeout`.
comm::ProcessGroupPtr worker_process_group(
    std::chrono::milliseconds timeout = std::chrono::seconds(60),
    const std::string& backend = "gloo", const comm::NcclOptions& nccl = {});
// A variable of the worker's environment: the launcher's (RANK, LOCAL_RANK) or one the parent set
// for the library through run_workers' env (throws if absent and no fallback). Parameters of the
// test come as the body's Case.
std::string worker_env(const std::string& key, const std::string& fallback = "\x01");

// Throws with `what` when the condition fails: a worker's assertion.
void require(bool condition, const std::string& what);

}  // namespace ddp::testing
