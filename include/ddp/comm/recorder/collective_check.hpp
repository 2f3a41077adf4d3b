#pragma once
// CollectiveCheck: a desync found before it hangs (ProcessGroup::Config::check_collectives).
//
// [Note: collective check] Before a group issues collective #n, each rank offers its fingerprint
// of it ("<kind> of <count> <dtype> elements for <purpose>", as the flight recorder writes it)
// to the store with one compare-and-set on key "check/<n mod 1024>": the first rank to reach #n
// stores its fingerprint, every later rank gets that one back and compares. No rank waits for
// another (one store round trip, ~50 us on loopback), so the check costs no overlap; the rank
// that finds a difference has not issued #n yet, so it raises instead of joining a collective
// that would hang or silently mix two tensors:
//   "collective #7 of group ddp/world differs across ranks: rank 0 issued all-reduce (sum) of 4
//    Float elements for bucket 1 of plan epoch 0; rank 1 was about to issue all-reduce (sum) of 4
//    Float elements for bucket 2 of plan epoch 0"
// and publishes that sentence under "check/differs", where the other ranks' error reports
// (CollectiveProgress::report) read it when their own collective then fails or times out.
// The 1024 slots are reused: a value older than #n is swapped out with a second compare-and-set
// against it (each rank remembers what it saw in each slot, so one round trip is the usual).

#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::comm {

struct CollectiveOp;
struct CollectivePurpose;

class CollectiveCheck {
 public:
  // `store`: the group's (prefixed) store; `rank`: in the group; `group`: its name for errors.
  CollectiveCheck(c10::intrusive_ptr<c10d::Store> store, int rank, std::string group);

  // Before collective #seq is issued: its fingerprint against the first rank's that reached #seq.
  // Returns "" when they agree, else the sentence of the Note (published for the other ranks);
  // the caller raises it.
  std::string before(int64_t seq, const std::string& fingerprint);

  // "all-reduce (sum) of 4 Float elements for bucket 1 of plan epoch 0".
  static std::string fingerprint(const CollectiveOp& op, const CollectivePurpose& purpose);

  // Key under the group's prefix holding the first difference found, if any.
  static const char* differs_key() { return "check/differs"; }

  // Pure: the sentence for a difference at #seq between `first` (who stored its fingerprint) and
  // this rank, which was about to issue `mine`.
  static std::string differs(const std::string& group, int64_t seq, int first_rank,
                             const std::string& first, int rank, const std::string& mine);

 private:
  // Slots of the store reused for collectives; more than any number of collectives in flight.
  static constexpr int64_t kSlots = 1024;

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const std::string group_;
  // What this rank last saw in each slot ("<seq> <rank> <fingerprint>"): the expected value of the
  // compare-and-set that replaces it. Empty: never seen.
  std::vector<std::string> seen_;
};

}  // namespace ddp::comm
