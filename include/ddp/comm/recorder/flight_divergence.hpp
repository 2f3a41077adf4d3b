#pragma once
// The analysis ddp-forensics prints: the ranks' flight recorder dumps (flight_dump.hpp) lined up
// by group and sequence number, and one sentence naming the first divergence.

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/comm/recorder/flight_dump.hpp"

namespace ddp::comm {

struct Divergence {
  // "mismatch": ranks issued different collectives at one sequence number; "steps": ranks issued
  // one collective number in different steps (a skipped or extra step); "stopped": a rank was
  // stopped (SIGSTOP, a debugger) while another failed or timed out waiting for it; "missing": a
  // rank never issued a collective others issued; "stuck": a rank issued a collective another
  // timed out in and never completed it, waiting longer than that timeout; "no dump": a rank left
  // no dump; "broke": every rank issued the same collectives but one failed or timed out in one,
  // and none of the above names a rank; "none": every rank issued the same collectives.
  std::string kind;
  std::string sentence;  // the first divergence in one sentence
  std::string group;     // where it is ("" for "none" and "no dump")
  int64_t seq = 0;
  std::vector<int> ranks;  // the ranks at fault
};

// The first divergence of `dumps` (one per rank present) in a world of `world_size` ranks.
// Mismatches and step differences come first (the earliest issued), then a stopped rank, then the
// rank that fell behind earliest (the lowest count in its group), then a rank stuck inside a
// collective, then ranks without a dump, then where the job broke. Times in UTC.
Divergence first_divergence(const std::vector<RankDump>& dumps, int world_size);

}  // namespace ddp::comm
