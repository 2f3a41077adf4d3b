// Rendezvous failures name what is wrong, within the rendezvous timeout: a missing rank, a store
// that cannot be reached, an address that does not resolve.

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <chrono>

#include "ddp/comm/init.hpp"
#include "ddp/launch/spawn.hpp"

namespace ddp::testing {
namespace {

using Clock = std::chrono::steady_clock;

struct Outcome {
  std::string error;
  std::chrono::milliseconds took{0};
};

// Runs init_process_group in this process (no worker needed: it must fail before any backend).
Outcome init_as(int rank, int world, const std::string& addr, uint16_t port,
                std::chrono::milliseconds rendezvous_timeout) {
  comm::InitOptions options;
  options.world = comm::WorldInfo{rank, world, 0, addr, port};
  options.rendezvous_timeout = rendezvous_timeout;
  options.timeout = rendezvous_timeout;
  Outcome out;
  const auto start = Clock::now();
  try {
    comm::init_process_group(options);
  } catch (const c10::Error& e) {
    out.error = e.what_without_backtrace();
  }
  out.took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  return out;
}

TEST(Rendezvous, AMissingRankFailsWithinTheTimeoutSayingHowManyJoined) {
  const uint16_t port = launch::find_free_port();
  const auto out = init_as(0, 2, "127.0.0.1", port, std::chrono::seconds(3));
  EXPECT_EQ(out.error, "ddp: rendezvous at 127.0.0.1:" + std::to_string(port) +
                           " failed on rank 0 of 2 within the timeout of 3000 ms: 1 of 2 ranks "
                           "joined (the others did not start, or cannot reach 127.0.0.1:" +
                           std::to_string(port) + ")");
  EXPECT_GE(out.took, std::chrono::milliseconds(2900));
  EXPECT_LT(out.took, std::chrono::seconds(6)) << "took " << out.took.count() << " ms";
}

TEST(Rendezvous, AnUnreachableStoreIsNamed) {
  // Nothing listens on the port: rank 1 retries until the timeout, then says so.
  const uint16_t port = launch::find_free_port();
  const auto out = init_as(1, 2, "127.0.0.1", port, std::chrono::seconds(2));
  const std::string head =
      "ddp: rank 1 of 2 could not connect to the rendezvous store at "
      "127.0.0.1:" +
      std::to_string(port) +
      " within the rendezvous timeout of 2000 ms: the store at rank 0 was "
      "not reachable";
  EXPECT_EQ(out.error.substr(0, head.size()), head) << out.error;
  EXPECT_LT(out.took, std::chrono::seconds(4)) << "took " << out.took.count() << " ms";
}

TEST(Rendezvous, AnUnresolvableAddressFailsAtOnceNamingIt) {
  for (int rank : {0, 1}) {
    const auto out = init_as(rank, 2, "no-such-host.invalid", 29500, std::chrono::seconds(30));
    EXPECT_EQ(out.error.rfind("ddp: MASTER_ADDR 'no-such-host.invalid' cannot be resolved (", 0),
              0u)
        << out.error;
    EXPECT_NE(out.error.find("set it to the host name or address of rank 0"), std::string::npos)
        << out.error;
    EXPECT_LT(out.took, std::chrono::seconds(1)) << "took " << out.took.count() << " ms";
  }
}

}  // namespace
}  // namespace ddp::testing
