#pragma once
// A flight recorder dump read back ([Note: flight recorder] in flight_recorder.hpp): what
// ddp-forensics reads (flight_divergence.hpp lines the ranks' dumps up).

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::comm {

struct DumpedCollective {
  int64_t seq = 0;
  std::string kind;   // "all-reduce (sum)"
  std::string dtype;  // "Float"
  int64_t numel = -1;
  int root = -1;
  std::string purpose;  // purpose_name(): "bucket", "unit gather", "user", ...
  int64_t index = -1;
  int64_t epoch = -1;
  int64_t step = -1;
  int64_t issued_us = 0;
  int64_t ended_us = 0;
  std::string state;    // "issued", "completed", "failed", "timed out", "refused", "captured"
  int64_t replay = -1;  // the captured step whose CUDA-graph replay ran it; -1: eager

  // "all-reduce (sum) of 4 Float elements for bucket 0 of plan epoch 0", then " (replay of
  // captured step 12)" for a replay's.
  std::string describe() const;
  // What must agree across ranks at one sequence number: kind, dtype, count, root, purpose.
  std::string signature() const;
};

struct DumpedGroup {
  std::string name;
  int mesh_dim = -1;
  int rank = 0;
  std::vector<int> global_ranks;
  int64_t issued = 0;
  std::vector<DumpedCollective> entries;  // oldest first, consecutive sequence numbers
};

struct RankDump {
  std::string path;
  int rank = 0;  // global
  int world_size = 0;
  std::string reason;
  int64_t dumped_us = 0;  // when the dump was written, unix microseconds
  // When SIGCONT last continued the process (unix microseconds; 0: never, or a dump from before
  // it was recorded): the launcher continues only a stopped worker before stopping it.
  int64_t continued_us = 0;
  std::vector<DumpedGroup> groups;
};

// Reads and checks one dump: JSON, format "ddp-flight-recorder", version kFlightDumpVersion,
// every field of the right type, entries consecutive. Anything else throws std::runtime_error
// naming the file and what is wrong ("<path>: field 'groups[0].entries[3].seq' is missing or not
// an integer"), never crashes.
RankDump read_flight_dump(const std::string& path);
// The same from the file's text (the fuzz tests' entry); `path` only names it in errors.
RankDump parse_flight_dump(const std::string& text, const std::string& path);
// Every "flight-rank<R>.json" of `dir`, by rank; refuses two dumps of one rank, dumps that
// disagree on the world size, and a directory with none.
std::vector<RankDump> read_flight_dumps(const std::string& dir);

// "12:01:03.418" (UTC) of a unix time in microseconds.
std::string clock_time(int64_t unix_us);

}  // namespace ddp::comm
