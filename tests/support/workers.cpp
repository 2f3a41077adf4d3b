#include "support/workers.hpp"

#include <algorithm>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>

#include "ddp/comm/init.hpp"
#include "ddp/detail/torch_compat.hpp"

namespace ddp::testing {

namespace {

using WorkerBody = std::function<void(const std::string&)>;

std::map<std::string, WorkerBody>& registry() {
  static std::map<std::string, WorkerBody> workers;
  return workers;
}

}  // namespace

void register_worker(const std::string& name, WorkerBody body) {
  // Two workers of one name would leave which one runs to static initialisation order.
  if (!registry().emplace(name, std::move(body)).second) {
    std::cerr << "two test workers are named '" << name << "'\n";
    std::abort();
  }
}

namespace {

#if !DDP_HAVE_NCCL
// In a forked worker: the state a fresh process would start with where the parent may have
// changed it (the default generator's seed), then the worker named in the environment.
int run_forked_worker() {
  {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(c10::default_rng_seed_val);
  }
  return maybe_run_worker();
}
#endif

}  // namespace

// A worker's exit code when its rendezvous store's port was taken (EX_TEMPFAIL): run_workers
// tries again on a fresh port.
constexpr int kPortTaken = 75;

namespace detail {

launch::SpawnResult run_worker_processes(const std::string& name, int world,
                                         const std::string& case_text,
                                         const std::map<std::string, std::string>& env,
                                         std::chrono::seconds timeout) {
  launch::SpawnOptions options;
  options.nproc = world;
  options.argv = {launch::self_executable()};
  options.env = env;
  options.env["DDP_TEST_WORKER"] = name;
  options.env[kCaseVariable] = case_text;
  options.timeout = timeout;
  options.grace = std::chrono::seconds(30);
  // Ctrl-C and ctest's timeout must still end the test binary itself; the workers die with it.
  options.forward_signals = false;
  options.name = "ddp_tests";
#if !DDP_HAVE_NCCL
  // On the CPU build each worker is a fork of this binary rather than an exec of it: the same
  // registry and code without libtorch's start-up again (~0.7 s of CPU each, on 2 cores the
  // largest part of the suite). The GPU build execs: a fork cannot use CUDA.
  options.fork_main = [] { return run_forked_worker(); };
#endif
  // The store's port is free when picked and bound a moment later; another process (NCCL's
  // bootstrap binds ephemeral ports) may take it in between. A group whose rank 0 could not bind
  // it (exit code kPortTaken) runs again on a fresh port, at most twice more.
  launch::SpawnResult result;
  for (int attempt = 0; attempt < 3; ++attempt) {
    result = launch::spawn_local_workers(options);
    const bool port_taken = !result.workers.empty() && !result.workers[0].signaled &&
                            result.workers[0].exit_code == kPortTaken;
    if (!port_taken) break;
  }
  return result;
}

}  // namespace detail

int maybe_run_worker() {
  const char* name = std::getenv("DDP_TEST_WORKER");
  if (name == nullptr) return -1;
  at::set_num_threads(1);  // workers share 2 cores; intra-op threads would only contend
  const char* rank = std::getenv("RANK");
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::cerr << "unknown test worker '" << name << "'\n";
    return 2;
  }
  const char* case_text = std::getenv(detail::kCaseVariable);
  try {
    it->second(case_text != nullptr ? case_text : "");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "[worker " << name << " rank " << (rank ? rank : "?") << "] FAILED: " << e.what()
              << "\n";
    // rendezvous.cpp's words when the store's port was taken after it was picked.
    const bool port_taken = std::string(e.what()).find("is the port in use?") != std::string::npos;
    return port_taken ? kPortTaken : 1;
  }
}

comm::ProcessGroupPtr worker_process_group(std::chrono::milliseconds timeout,
                                           const std::string& backend,
                                           const comm::NcclOptions& nccl) {
  comm::InitOptions options;
  options.backend = backend;
  options.nccl = nccl;
  // Workers may start seconds apart on a loaded 2-core machine; a short collective timeout (what
  // timeout tests use) must not also bound the rendezvous.
  options.rendezvous_timeout =
      std::max<std::chrono::milliseconds>(timeout, std::chrono::seconds(60));
  options.timeout = timeout;
  return comm::init_process_group(options);
}

std::string worker_env(const std::string& key, const std::string& fallback) {
  const char* value = std::getenv(key.c_str());
  if (value != nullptr) return value;
  if (fallback != "\x01") return fallback;
  throw std::runtime_error("test worker needs environment variable " + key);
}

void require(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

}  // namespace ddp::testing
