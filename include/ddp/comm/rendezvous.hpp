#pragma once
// Rendezvous: rank 0 serves a c10d TCPStore at MASTER_ADDR:MASTER_PORT (under torchrun the agent
// serves it), every rank connects and counts itself in, and every rank returns once all
// world_size ranks have joined, or fails within the rendezvous timeout with a message that says
// what is wrong:
//   - MASTER_ADDR does not resolve: at once (getaddrinfo runs before anything else), naming it;
//   - a rank that cannot connect: the address, the timeout, "the store at rank 0 was not
//     reachable";
//   - ranks missing: the address, the timeout and "1 of 2 ranks joined".

#include <chrono>
#include <string>

#include "ddp/comm/env.hpp"
#include "ddp/detail/torch_compat.hpp"

namespace ddp::comm {

// The rendezvous store (unprefixed; under torchrun's agent store: under the restart's prefix).
// Its timeout is `timeout`; init_process_group sets the collective timeout once the backend is up.
c10::intrusive_ptr<c10d::Store> rendezvous(const WorldInfo& world,
                                           std::chrono::milliseconds timeout);

// A further client connection to the store of a completed rendezvous (the desync heartbeat's):
// waits for nobody.
c10::intrusive_ptr<c10d::Store> connect_store(const WorldInfo& world,
                                              std::chrono::milliseconds timeout);

// Fails at once, naming `host`, when getaddrinfo cannot resolve it.
void check_resolvable(const std::string& host, const char* what = "MASTER_ADDR");

}  // namespace ddp::comm
