#pragma once
// FlightRing: one group's part of the flight recorder ([Note: flight recorder] in
// flight_recorder.hpp): the numbering of the group's collectives and the newest `capacity` of
// them, each with what it was and what became of it. CollectiveProgress owns one per group; every
// ring of the process is listed, so that a dump (any thread, any failure) writes all of them.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/recorder/flight_recorder.hpp"

namespace ddp::comm {

// What a collective was, kept cheaply on the hot path and put into words only for an error.
struct CollectiveOp {
  const char* kind = "";  // "all-reduce (sum)", "broadcast", ...: a string literal
  int64_t numel = -1;     // elements of its tensor; -1: none (barrier)
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  int root = -1;  // broadcast's source rank; -1: none

  // "all-reduce (sum) of 4 Float elements", "broadcast from rank 0 of 8 Long elements".
  std::string describe() const;

  // The bytes one rank sends for it on a group of `world` ranks under the ring algorithms (the
  // large-message algorithms of NCCL and Gloo), B its tensor's bytes: an all-reduce 2 (n - 1) / n
  // * B; a reduce-scatter of a whole of B (n - 1) / n * B, an all-reduce's where `emulated` (Gloo
  // 1.13 has no reduce-scatter); a flat all-gather of a whole of B (n - 1) / n * B; an all-gather
  // of B per rank (n - 1) * B; a broadcast B; a barrier, or one rank, nothing.
  int64_t wire_bytes(int world, bool emulated) const;
};

struct FlightEntry {
  int64_t seq = 0;  // 1, 2, ... in the group, on every rank the same collective
  CollectiveOp op;
  CollectivePurpose purpose;
  int64_t step = -1;           // note_step's at the issue; -1: unknown
  int64_t issued_us = 0;       // unix time of the issue, microseconds
  int64_t ended_us = 0;        // when its wait returned or failed; 0: not seen ending
  const void* work = nullptr;  // the c10d work, an identity only (never dereferenced)
  FlightState state = FlightState::kIssued;
  int64_t replay = -1;  // the captured step whose CUDA-graph replay ran it; -1: issued eagerly
};

// The collectives a CUDA-graph capture recorded (FlightRing::capture_since), replayed into the
// ring at each replay of the graph.
struct CapturedCollectives {
  std::vector<FlightEntry> entries;  // in issue order
  int64_t lost = 0;  // captured, but overwritten in the ring before the capture ended
};

// One group's ring as a dump writes it.
struct FlightGroup {
  std::string name;               // the group's store prefix: "ddp/world", "ddp/world/mesh0/1/0"
  int rank = 0;                   // this process's rank in the group
  std::vector<int> global_ranks;  // by group rank
  int64_t issued = 0;             // collectives issued so far (entries may hold fewer)
  int64_t capacity = 0;
  std::vector<FlightEntry> entries;  // oldest first
};

class FlightRing {
 public:
  // Listed for dumps until destroyed. `capacity` entries are allocated here, once; 0: the ring
  // only numbers collectives (the recorder off).
  FlightRing(std::string name, int rank, std::vector<int> global_ranks, int64_t capacity);
  ~FlightRing();
  FlightRing(const FlightRing&) = delete;
  FlightRing& operator=(const FlightRing&) = delete;

  // Numbers the collective (the next sequence number, returned) and records it with this
  // thread's purpose and the noted step. The oldest entry is overwritten when the ring is full.
  // `state`: kIssued, or kRefused for a collective the check stopped (`work` null).
  int64_t record(const void* work, const CollectiveOp& op,
                 FlightState state = FlightState::kIssued);
  // The newest entry of `work` still issued becomes `state` (completed, failed, timed out), with
  // the time. A work no longer in the ring, or already ended, is left alone.
  void end(const void* work, FlightState state);
  // Collectives numbered so far.
  int64_t issued() const;
  // The newest entry of `work` that is still issued; `work` null: the newest entry still issued.
  // None: nothing matches (then the caller names collective #issued()).
  std::optional<FlightEntry> pending(const void* work) const;
  FlightGroup snapshot() const;
  // The newest entry (#issued()); none when nothing was issued or the recorder is off.
  std::optional<FlightEntry> newest() const;

  // After a CUDA-graph capture: the entries numbered after `issued_before` become captured, and
  // are returned for the replays.
  CapturedCollectives capture_since(int64_t issued_before);
  // A replay of captured step `replay`: each captured collective numbered and recorded again,
  // issued now, as that replay's. Returns the first sequence number (the last: + size - 1).
  int64_t record_replay(const CapturedCollectives& captured, int64_t replay);
  // The replay's collectives `first`..`last` that are still issued become `state`.
  void end_range(int64_t first, int64_t last, FlightState state);

 private:
  const std::string name_;
  const int rank_;
  const std::vector<int> global_ranks_;
  mutable std::mutex mutex_;
  std::vector<FlightEntry> slots_;  // slot of seq s: (s - 1) % capacity; fixed size
  int64_t issued_ = 0;              // only grows; entries held: min(issued_, capacity)
};

// This thread's purpose (ForPurpose) and the noted step, as record() reads them.
CollectivePurpose current_purpose();
int64_t current_step();

// Every ring of this process (for dumps), in the order made. The registry's lock is held while
// `visit` runs: a ring being destroyed waits for it.
void for_each_flight_ring(const std::function<void(const FlightRing&)>& visit);

}  // namespace ddp::comm
