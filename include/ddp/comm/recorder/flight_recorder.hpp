#pragma once
// [Note: flight recorder] Every collective of every group of this process is recorded, as it is
// issued, into a fixed ring per group (comm/recorder/flight_ring.hpp): its sequence number in the
// group, kind, dtype, element count, root, what it was for, the step, when it was issued and ended,
// and its state. When something fails (a wait that throws, the watchdog's timeout, SIGTERM from the
// launcher) or on request (SIGUSR1, dump_flight_recorder), this rank's rings are written to
// "<dir>/flight-rank<R>.json", atomically; `ddp-forensics <dir>` lines the ranks' dumps up by
// group and sequence number and names the first divergence. PyTorch's Flight Recorder does this
// for NCCL from Python; this one records every backend, and the purpose of each collective.
//
// Cost on the hot path: one uncontended lock, one clock read and a fixed-size copy into a slot
// allocated when the group was made; no allocation, no lock held across a collective.

#include <cstdint>
#include <string>

namespace ddp::comm {

// The dump's "version"; ddp-forensics refuses another. "format" is "ddp-flight-recorder".
constexpr int kFlightDumpVersion = 1;

struct FlightRecorderOptions {
  // Entries kept per group, the newest. Default 4096: at ~30 collectives per bucketed step, the
  // last hundred steps, 0.5 MB a group. DDP_FLIGHT_RECORDER_SIZE overrides the default. 0: off
  // (collectives are still numbered for desync errors, nothing is kept, dumps hold no entries),
  // what the recorder's cost is measured against (docs/benchmarks.md).
  int64_t capacity = 4096;
  // Where the dumps go: "<dir>/flight-rank<global rank>.json". Default "" (or
  // DDP_FLIGHT_RECORDER_DIR): the recorder records, and errors still say what it saw, but no file
  // is written and no signal handler installed.
  std::string dir;
};

// The process's recorder options: the environment's until set_flight_recorder is called. A new
// capacity applies to groups made afterwards. A non-empty dir is created when missing and
// installs the signal handlers: SIGUSR1 dumps and the process goes on; SIGTERM dumps and then
// ends the process as SIGTERM would (SIGPIPE, where it would end the process, likewise: a rank
// continued after its peers left dies of it writing to them); SIGABRT (c10d's NCCL watchdog
// aborting, an uncaught exception) dumps, waiting at most 10 s, and the process ends as it would
// have; SIGCONT notes when the process was continued (the dump's "continued_us": the launcher
// continues a stopped worker before stopping it, and ddp-forensics names the rank as stopped).
// Dumps are written one at a time, and SIGTERM's ends the process only once no other is being
// written: no temporary file is left behind. Throws on a negative capacity or a dir that cannot be
// made.
void set_flight_recorder(const FlightRecorderOptions& options);
FlightRecorderOptions flight_recorder_options();

// What a collective was for. Recorded with it and compared by ddp-forensics: two ranks that issue
// the same kind of collective for different purposes at one sequence number have diverged.
enum class Purpose : uint8_t {
  kUser,             // the user's own call (nothing of libddp's said otherwise)
  kBucket,           // a gradient bucket's reduction: index = bucket, epoch = plan epoch
  kUnitGather,       // a sharded unit's parameter all-gather: index = unit
  kUnitReduce,       // a sharded unit's gradient reduce-scatter: index = unit
  kParamBroadcast,   // the wrap's broadcast of rank 0's parameters and buffers
  kBufferBroadcast,  // a synchronised forward's broadcast of rank 0's buffers
  kCheckpoint,       // saving or loading a checkpoint
  kControl,          // a control scalar: a flag, a norm, a count every rank agrees on
  kCheck,            // a check across ranks: the replica check, the collectives' fingerprint
};

struct CollectivePurpose {
  Purpose what = Purpose::kUser;
  int64_t index = -1;  // bucket or unit; -1: none
  int64_t epoch = -1;  // the bucket plan's epoch; -1: none

  // "bucket 3 of plan epoch 0", "unit 4's parameters", "rank 0's buffers", ...: the one name of
  // the purpose, in errors ("broadcast of rank 0's buffers failed") as in dumps and ddp-forensics.
  std::string describe() const;
};

// The last purpose: the dump reader looks a name up among every one up to it.
constexpr Purpose kLastPurpose = Purpose::kCheck;

// The name ddp-forensics and the dumps use: "user", "bucket", "unit gather", ...
const char* purpose_name(Purpose purpose);

// What became of a collective. Transitions: issued -> completed | failed | timed out, once.
// Refused: never issued, the collective check found it differs from the other ranks' (recorded
// so that the dump shows what this rank was about to do); it ends nothing. Captured: issued into
// a CUDA graph being captured; it runs only in the graph's replays, each recorded anew.
enum class FlightState : uint8_t { kIssued, kCompleted, kFailed, kTimedOut, kRefused, kCaptured };

// "issued", "completed", "failed", "timed out", "refused", "captured"
const char* flight_state_name(FlightState state);
// The last state: the dump reader checks a state against every name up to it.
constexpr FlightState kLastFlightState = FlightState::kCaptured;

// While alive, the collectives this thread issues are recorded as being for `purpose`; nests
// (the innermost wins) and restores the outer one.
class ForPurpose {
 public:
  explicit ForPurpose(CollectivePurpose purpose);
  ~ForPurpose();
  ForPurpose(const ForPurpose&) = delete;
  ForPurpose& operator=(const ForPurpose&) = delete;

 private:
  CollectivePurpose saved_;
};

// The training step the collectives issued from now on belong to (the tools call it each step);
// -1 (the start): unknown. A new step is also told to the launcher (comm/launcher_channel.hpp),
// which names the step a worker failed at.
void note_step(int64_t step);

// Writes this rank's dump now, `reason` inside it ("SIGUSR1", "collective failed: ..."). Returns
// the file's path; "" when no dir is set or no group is alive (an earlier dump stays). Never throws
// (it runs on failure paths): a write that fails is said on stderr and "" returned.
std::string dump_flight_recorder(const std::string& reason);

}  // namespace ddp::comm
