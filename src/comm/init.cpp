#include "ddp/comm/init.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <cstdlib>

#include "ddp/comm/fake_backend.hpp"
#include "ddp/comm/launcher_channel.hpp"
#include "ddp/comm/made_backend.hpp"
#include "ddp/comm/rendezvous.hpp"
#include "ddp/detail/torch_compat.hpp"

#if DDP_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if DDP_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#if DDP_NCCL_HAS_MEM_POOL
#include "ddp/comm/nccl_window_pool.hpp"
#endif
#endif

namespace ddp::comm {

namespace {

// How much later than ours c10d's NCCL watchdog fires (see backend_factory).
constexpr std::chrono::seconds kC10dWatchdogMargin{30};

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

// The factory of the world group's backend, kept by the group to make its sub-groups the same
// way (same device, same timeout).
BackendFactory backend_factory(Backend backend, const WorldInfo& world,
                               std::chrono::milliseconds timeout, const NcclOptions& nccl_options) {
  if (backend == Backend::kGloo) {
#if DDP_HAVE_GLOO
    auto device = make_gloo_device(world);  // one device for every group, as PyTorch
    return [device, timeout](const c10::intrusive_ptr<c10d::Store>& store, int rank,
                             int size) -> MadeBackend {
      auto gloo_opts = c10d::ProcessGroupGloo::Options::create(timeout);
      gloo_opts->devices.push_back(device);
      return {c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_opts), {}, {}};
    };
#else
    (void)world;
    (void)nccl_options;
    TORCH_CHECK(false,
                "ddp: backend 'gloo' is not available in this build (libtorch was found "
                "without Gloo headers); use backend 'nccl'");
#endif
  }
  if (backend == Backend::kNccl) {
#if DDP_HAVE_NCCL
    return [timeout, nccl_options](const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                   int size) -> MadeBackend {
      auto nccl_opts = c10d::ProcessGroupNCCL::Options::create(nccl_options.high_priority_stream);
      // c10d's watchdog is the backstop behind ours (ProcessGroup's CollectiveWatchdog ends
      // the process naming the rank behind at `timeout`); at the same bound it would race
      // ours and win with a minute-long debug dump and an abort.
      nccl_opts->timeout = timeout + kC10dWatchdogMargin;
#if defined(NCCL_HAS_CONFIG) || defined(NCCL_HAS_COMM_NONBLOCKING)
      if (nccl_options.max_ctas > 0) nccl_opts->config.maxCTAs = nccl_options.max_ctas;
      if (nccl_options.min_ctas > 0) nccl_opts->config.minCTAs = nccl_options.min_ctas;
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
      if (nccl_options.cta_policy >= 0) nccl_opts->config.CTAPolicy = nccl_options.cta_policy;
#else
      TORCH_CHECK(nccl_options.cta_policy < 0,
                  "ddp: NcclOptions::cta_policy needs NCCL >= 2.27; this build has an older one");
#endif
#else
      TORCH_CHECK(
          nccl_options.max_ctas < 0 && nccl_options.min_ctas < 0 && nccl_options.cta_policy < 0,
          "ddp: NcclOptions' CTA settings need ProcessGroupNCCL::Options::config, "
          "which this libtorch does not have");
#endif
      auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, nccl_opts);
      MadeBackend made{nccl, {}, {}};
#if DDP_NCCL_HAS_MEM_POOL
      if (nccl_options.register_buffers) {
        // Refused here, before any collective, rather than at the wrap's first allocation:
        // ProcessGroupNCCL's allocator exists only where the GPU has CUDA multicast.
        const auto device = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice();
        TORCH_CHECK(nccl->supportsTensorAlloc(device.index()),
                    "ddp: NcclOptions::register_buffers (--nccl-register-buffers): NCCL cannot "
                    "allocate registered memory on ",
                    device,
                    " (ProcessGroupNCCL's allocator needs NCCL >= 2.19 and a GPU with CUDA "
                    "multicast, as GPUs joined by NVSwitch have); run without it");
        auto windows = std::make_shared<NcclWindowPool>(nccl);
        made.empty_registered = [windows](int64_t numel, const at::TensorOptions& options) {
          return windows->empty(numel, options);
        };
      }
#else
      TORCH_CHECK(!nccl_options.register_buffers,
                  "ddp: NcclOptions::register_buffers needs ProcessGroupNCCL's memory pools "
                  "(registerMemPool, torch >= 2.8); this libtorch has none");
#endif
#if defined(DDP_NCCL_HAS_SHUTDOWN) && DDP_NCCL_HAS_SHUTDOWN
      made.shutdown = [nccl] { nccl->shutdown(); };
#endif
      return made;
    };
#else
    (void)nccl_options;
    TORCH_CHECK(false,
                "ddp: backend 'nccl' is not available in this build (libtorch has no CUDA); "
                "use backend 'gloo'");
#endif
  }
  TORCH_CHECK(false, "ddp: unhandled backend ", static_cast<int>(backend));
}

// DDP_CHECK_COLLECTIVES: "1" on, "0" or unset off; anything else is named, not guessed.
bool check_collectives_from_env() {
  const char* value = std::getenv("DDP_CHECK_COLLECTIVES");
  if (value == nullptr) return false;
  const std::string text(value);
  TORCH_CHECK(text == "0" || text == "1",
              "ddp: DDP_CHECK_COLLECTIVES must be 1 (check every "
              "collective's fingerprint across ranks) or 0, got '",
              text, "'");
  return text == "1";
}

// This rank's device: CPU, or its GPU made current for the calling thread (InitOptions).
c10::Device pinned_device(Backend backend, const WorldInfo& world, std::optional<int> index) {
  const auto type = traits(backend).device_type;
  if (type == c10::DeviceType::CPU) return c10::Device(c10::kCPU);
  const int gpu = index.value_or(world.local_rank);
  const auto* guard = c10::impl::getDeviceGuardImpl(type);
  const int count = static_cast<int>(guard->deviceCount());
  TORCH_CHECK(gpu >= 0 && gpu < count, "ddp: rank ", world.rank, " wants GPU ", gpu,
              (index ? " (InitOptions::device_index)" : " (its LOCAL_RANK)"), " but this host has ",
              count, ": start at most ", count, " workers per host, one per GPU");
  const c10::Device device(type, static_cast<c10::DeviceIndex>(gpu));
  guard->setDevice(device);
  return device;
}

}  // namespace

std::chrono::milliseconds default_collective_timeout() {
  const char* text = std::getenv("DDP_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return std::chrono::minutes(5);
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  TORCH_CHECK(end != text && *end == '\0' && seconds > 0 && seconds <= 1e7, "ddp: DDP_TIMEOUT_S='",
              text, "' is not a collective timeout: expected a positive number of seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

ProcessGroupPtr init_process_group(const InitOptions& options) {
  const Backend backend = parse_backend(options.backend);
  const WorldInfo world = options.world ? *options.world : world_info_from_env(process_env());
  TORCH_CHECK(options.timeout.count() > 0, "ddp: InitOptions::timeout must be positive, got ",
              options.timeout.count(), " ms");
  const auto rendezvous_timeout = options.rendezvous_timeout.value_or(options.timeout);
  TORCH_CHECK(rendezvous_timeout.count() > 0,
              "ddp: InitOptions::rendezvous_timeout must be positive, got ",
              rendezvous_timeout.count(), " ms");
  const FlightRecorderOptions recorder =
      options.flight_recorder.value_or(flight_recorder_options());
  if (options.flight_recorder || !recorder.dir.empty()) set_flight_recorder(recorder);
  ProcessGroup::Config config;
  config.backend = backend;
  config.rank = world.rank;
  config.size = world.world_size;
  config.timeout = options.timeout;
  config.make_backend = options.fake_collectives
                            ? fake_backend_factory()
                            : backend_factory(backend, world, options.timeout, options.nccl);
  config.watch_collectives = options.watch_collectives;
  config.check_collectives = options.check_collectives.value_or(check_collectives_from_env());
  config.device = pinned_device(backend, world, options.device_index);
  auto store = rendezvous(world, rendezvous_timeout);
  // A second connection to the same store for the collective-progress heartbeat: a TCPStore
  // client serializes its operations, so a heartbeat sharing the main connection would stall
  // behind a long store wait of the main thread and go silent exactly when it matters.
  c10::intrusive_ptr<c10d::Store> progress;
  if (world.world_size > 1) progress = connect_store(world, options.timeout);
  // The backend connects (Gloo exchanges addresses through the store) still under the rendezvous
  // bound: every rank has joined, but they may reach this point seconds apart.
  auto group = ProcessGroup::create(std::move(config), store, progress);
  // From now on the store's own waits (replica check, exchanges, sub-groups) use the collective
  // timeout.
  store->setTimeout(options.timeout);
  // Joined: a failure from now on is not one at start-up (comm/launcher_channel.hpp).
  tell_launcher_ready();
  return group;
}

}  // namespace ddp::comm
