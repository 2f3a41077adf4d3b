#pragma once
// CollectiveProgress: the sequence numbers behind desync detection.
//
// [Note: sequence numbers] Every collective a ProcessGroup issues gets the next number (1, 2, ...)
// on this rank; collectives match across ranks by order, so on a healthy job the n-th collective
// of every rank is the same one. A heartbeat thread publishes "<issued> <unix ms>" under
// progress/<rank> in the group's store (so under its prefix: ddp/world/progress/1) every
// `interval`; each group numbers its own collectives. When a wait fails (timeout, dead peer),
// report() publishes this rank's state at once, reads every rank's, and says who is behind and at
// which collective: "rank 1 is behind: it had issued 7 collectives at its last report 0.2 s ago
// (reports every 1.0 s), this rank waits on #8". Ranks are the group's. A rank whose report is
// older than 3 intervals is named as dead or stopped (its heartbeat is silent). The published
// state also carries the rank's newest collective
// ("<issued> <unix ms> <state> <what it was for>"), so that the error says what the rank behind
// last did ("rank 1's last, #7 (all-reduce ... for bucket 0 of plan epoch 1), completed") and
// names a rank that issued a different collective at the same number: the first divergence, as
// ddp-forensics would name it from the dumps, but from the store and within the timeout.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/recorder/flight_ring.hpp"
#include "ddp/detail/torch_compat.hpp"

namespace ddp::comm {

class CollectiveProgress {
 public:
  // `store`: the group's (prefixed) store; `rank`, `world_size`: in the group.
  // `interval`: how often the heartbeat publishes; default 1 s (DDP_HEARTBEAT_MS overrides it in
  // init), cheap next to any collective timeout. World size 1 starts no thread. `name`,
  // `global_ranks` (by group rank; empty: the identity) and `capacity`: the group's flight ring.
  CollectiveProgress(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                     std::chrono::milliseconds interval, std::string name = "ddp/world",
                     std::vector<int> global_ranks = {},
                     int64_t capacity = FlightRecorderOptions{}.capacity);
  ~CollectiveProgress();
  CollectiveProgress(const CollectiveProgress&) = delete;
  CollectiveProgress& operator=(const CollectiveProgress&) = delete;

  // Numbers `work` (the next sequence number) and records it in the flight ring.
  int64_t issued(const c10d::Work* work, const CollectiveOp& op);
  // The collective check stopped this one before its issue: numbered and recorded as refused.
  void refused(const CollectiveOp& op);
  // Its wait returned (completed) or threw (failed, timed out).
  void done(const c10d::Work* work, FlightState state = FlightState::kCompleted);
  // Collectives issued so far by this rank.
  int64_t count() const;
  // The flight ring (CUDA-graph captures and replays record through it).
  FlightRing& ring() { return *ring_; }
  // After `work` failed: "; collective #8 of rank 0 (all-reduce ...); rank 1 is behind: ...", to
  // go inside the error's parenthesis, with what a rank's collective check found ("; the collective
  // check found: ..."). Bounded: reads only keys that exist, never waits for a rank, and gives up
  // on the store after 2 s (rank 0 serves it and may be the rank that is stopped).
  // `work` null: about the newest collective this rank issued.
  std::string report(const c10d::Work* work);

  // Pure: the text report() builds from the ranks' published states. `states[r]` is
  // "<issued> <unix ms>[ <state> <fingerprint>]" (the newest collective's; state words joined by
  // '_') or empty when rank r never published; `now_ms` the reader's clock; `fingerprint` this
  // rank's of #waiting_on ("" unknown).
  static std::string describe(int64_t waiting_on, const std::string& op, int rank,
                              const std::vector<std::string>& states, int64_t now_ms,
                              std::chrono::milliseconds interval,
                              const std::string& fingerprint = "");

 private:
  struct Heartbeat;  // the heartbeat thread's state (collective_progress.cpp)

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds interval_;
  // The numbering and the newest collectives, each with what became of it. Works waited for
  // elsewhere (a comm hook's future) stay "issued" until the ring overwrites them. Shared with the
  // heartbeat thread, which holds no pointer to this object: a heartbeat stuck in the store (rank
  // 0 stopped: a store call to a stopped server never returns) is left behind by the destructor
  // after a bound, instead of hanging the unwinding of a failed job.
  std::shared_ptr<FlightRing> ring_;
  std::shared_ptr<Heartbeat> heartbeat_;  // null with world size 1 or no store
};

}  // namespace ddp::comm
