#include "ddp/comm/rendezvous.hpp"

#include <c10/util/Exception.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace ddp::comm {

namespace {

// Every rank adds 1 once connected; the value is how many have joined.
constexpr const char* kJoinedKey = "ddp/rendezvous/joined";

bool use_agent_store() {
  // Under torchrun the agent already serves a store on MASTER_PORT and says so with
  // TORCHELASTIC_USE_AGENT_STORE; every worker is then a client, under the restart's prefix.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  return agent_store != nullptr && std::string(agent_store) == "True";
}

std::string address_of(const WorldInfo& world) {
  return world.master_addr + ":" + std::to_string(world.master_port);
}

c10::intrusive_ptr<c10d::Store> open_store(const WorldInfo& world,
                                           std::chrono::milliseconds timeout, bool serve) {
  c10d::TCPStoreOptions opts;
  opts.port = world.master_port;
  opts.isServer = serve;
  opts.numWorkers = static_cast<size_t>(world.world_size);
  // Joining is counted by rendezvous() itself, which can then say how many ranks came.
  opts.waitWorkers = false;
  opts.timeout = timeout;
  try {
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(world.master_addr, opts);
    if (!use_agent_store()) return store;
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    return c10::make_intrusive<c10d::PrefixStore>(
        std::string("/worker/attempt_") + (attempt ? attempt : "0"), store);
  } catch (const std::exception& e) {
    const std::string cause = e.what();
    if (serve) {
      TORCH_CHECK(false, "ddp: rank 0 of ", world.world_size,
                  " could not serve the rendezvous store at ", address_of(world),
                  " (is the port in use? pick another MASTER_PORT): ", cause);
    }
    TORCH_CHECK(false, "ddp: rank ", world.rank, " of ", world.world_size,
                " could not connect to the rendezvous store at ", address_of(world),
                " within the rendezvous timeout of ", timeout.count(),
                " ms: the store at rank 0 was not reachable (is rank 0 running, and are "
                "MASTER_ADDR and MASTER_PORT its address?): ",
                cause);
  }
}

}  // namespace

void check_resolvable(const std::string& host, const char* what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  TORCH_CHECK(rc == 0, "ddp: ", what, " '", host, "' cannot be resolved (", ::gai_strerror(rc),
              "): set it to the host name or address of rank 0");
}

c10::intrusive_ptr<c10d::Store> rendezvous(const WorldInfo& world,
                                           std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  // Before anything else: a typo in MASTER_ADDR would otherwise cost the whole timeout.
  check_resolvable(world.master_addr);
  auto store = open_store(world, timeout, world.rank == 0 && !use_agent_store());
  int64_t joined = 0;
  std::string cause;
  try {
    joined = store->add(kJoinedKey, 1);
    // Polled, not waited on: a count read between polls is what the error reports, and a
    // TCPStore wait that timed out leaves its connection unusable for that read. 10-100 ms
    // between polls costs nothing next to process start-up.
    auto pause = std::chrono::milliseconds(10);
    while (joined < world.world_size) {
      const auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::steady_clock::now() - start);
      if (left.count() <= 0) break;
      std::this_thread::sleep_for(std::min(pause, left));
      pause = std::min(pause * 2, std::chrono::milliseconds(100));
      joined = store->add(kJoinedKey, 0);
    }
  } catch (const std::exception& e) {
    cause = std::string(": ") + e.what();  // the store went away (rank 0 ended)
  }
  TORCH_CHECK(joined >= world.world_size, "ddp: rendezvous at ", address_of(world),
              " failed on rank ", world.rank, " of ", world.world_size, " within the timeout of ",
              timeout.count(), " ms: ", joined, " of ", world.world_size,
              " ranks joined (the others did not start, or cannot reach ", address_of(world), ")",
              cause);
  return store;
}

c10::intrusive_ptr<c10d::Store> connect_store(const WorldInfo& world,
                                              std::chrono::milliseconds timeout) {
  return open_store(world, timeout, /*serve=*/false);
}

}  // namespace ddp::comm
