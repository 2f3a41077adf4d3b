#include "ddp/comm/init.hpp"

#include <c10/util/Exception.h>

#include <cstdlib>

#include "ddp/detail/torch_compat.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#if DDP_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if DDP_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace ddp::comm {

namespace {

c10::intrusive_ptr<c10d::Store> make_store(const WorldInfo& world,
                                           std::chrono::milliseconds timeout,
                                           bool progress_client = false) {
  // Under torchrun the agent already serves a store on MASTER_PORT and says so with
  // TORCHELASTIC_USE_AGENT_STORE; every worker is then a client, under the restart's prefix.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool use_agent_store = agent_store != nullptr && std::string(agent_store) == "True";
  c10d::TCPStoreOptions opts;
  opts.port = world.master_port;
  opts.isServer = world.rank == 0 && !use_agent_store && !progress_client;
  opts.numWorkers = static_cast<size_t>(world.world_size);
  // Rank 0 returns only when every rank has joined: a missing one times out. The progress client
  // connects after the rendezvous and waits for nobody.
  opts.waitWorkers = !progress_client;
  opts.timeout = timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, opts);
    if (!use_agent_store) return store;
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    return c10::make_intrusive<c10d::PrefixStore>(
        std::string("/worker/attempt_") + (attempt ? attempt : "0"), store);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "ddp: rendezvous at ", world.master_addr, ":", world.master_port,
                " failed on rank ", world.rank, " of ", world.world_size, " (timeout ",
                timeout.count(), " ms): ", e.what());
  }
}

// A second connection to the same store for the collective-progress heartbeat: a TCPStore client
// serializes its operations, so a heartbeat sharing the main connection would stall behind a long
// store wait of the main thread and go silent exactly when it matters. World size 1: none.
c10::intrusive_ptr<c10d::Store> progress_store(const WorldInfo& world,
                                               std::chrono::milliseconds timeout) {
  if (world.world_size == 1) return {};
  return make_store(world, timeout, /*progress_client=*/true);
}

#if DDP_HAVE_GLOO
// Which local interface Gloo binds: GLOO_SOCKET_IFNAME as in PyTorch; loopback when the whole job
// is on loopback (tests, --nproc); otherwise the interface of this host's name.
std::shared_ptr<::gloo::transport::Device> make_gloo_device(const WorldInfo& world) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  const std::string& addr = world.master_addr;
  if (addr == "localhost" || addr.rfind("127.", 0) == 0) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
#endif

}  // namespace

ProcessGroupPtr init_process_group(const InitOptions& options) {
  const WorldInfo world = options.world ? *options.world : world_info_from_env(process_env());
  TORCH_CHECK(options.timeout.count() > 0, "ddp: InitOptions::timeout must be positive, got ",
              options.timeout.count(), " ms");
  const auto rendezvous_timeout = options.rendezvous_timeout.value_or(options.timeout);
  TORCH_CHECK(rendezvous_timeout.count() > 0,
              "ddp: InitOptions::rendezvous_timeout must be positive, got ",
              rendezvous_timeout.count(), " ms");
  auto store = make_store(world, rendezvous_timeout);
  c10::intrusive_ptr<detail::CollectiveBackend> backend;
  if (options.backend == "gloo") {
#if DDP_HAVE_GLOO
    auto gloo_opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo_opts->devices.push_back(make_gloo_device(world));
    backend =
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, world.rank, world.world_size, gloo_opts);
#else
    TORCH_CHECK(false,
                "ddp: backend 'gloo' is not available in this build (libtorch was found "
                "without Gloo headers); use backend 'nccl'");
#endif
  } else if (options.backend == "nccl") {
#if DDP_HAVE_NCCL
    auto nccl_opts = c10d::ProcessGroupNCCL::Options::create();
    nccl_opts->timeout = options.timeout;
    auto nccl =
        c10::make_intrusive<c10d::ProcessGroupNCCL>(store, world.rank, world.world_size, nccl_opts);
    backend = nccl;
    store->setTimeout(options.timeout);
    auto group = std::make_shared<ProcessGroup>(backend, store, world.rank, world.world_size,
                                                options.backend, options.timeout,
                                                progress_store(world, options.timeout));
#if defined(DDP_NCCL_HAS_SHUTDOWN) && DDP_NCCL_HAS_SHUTDOWN
    group->set_shutdown([nccl] { nccl->shutdown(); });
#endif
    return group;
#else
    TORCH_CHECK(false,
                "ddp: backend 'nccl' is not available in this build (libtorch has no CUDA); "
                "use backend 'gloo'");
#endif
  } else {
    TORCH_CHECK(false, "ddp: unknown backend '", options.backend, "': expected 'gloo' or 'nccl'");
  }
  // Once the backend has connected (Gloo exchanges addresses through the store, still under the
  // rendezvous bound), the store's own waits (replica check, exchanges) use the collective timeout.
  store->setTimeout(options.timeout);
  return std::make_shared<ProcessGroup>(backend, store, world.rank, world.world_size,
                                        options.backend, options.timeout,
                                        progress_store(world, options.timeout));
}

}  // namespace ddp::comm
