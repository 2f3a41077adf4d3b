#pragma once
// What ddp-bench reports at the end: the bytes a rank holds and its step's memory by phase, rank
// 0's result line (or JSON object, the reference's fields first), and --init-only's line.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench_args.hpp"
#include "comm_floor.hpp"
#include "common/init_report.hpp"
#include "common/training_run.hpp"
#include "ddp/obs/step_memory.hpp"
#include "ddp/wrap/wrapped_model.hpp"

namespace ddp::tools::bench {

// What a rank holds after the last step (storage bytes), and the peaks of the timed steps.
struct Memory {
  int64_t params = 0, grads = 0, optimizer_state = 0;
  int64_t peak_gathered = 0;               // gathered units and collective buffers (0: DDP)
  ddp::wrap::GatheredBytes peak_by_owner;  // the same by owner
  // The caching allocator's peak on CUDA, the counted tensor storages' on the CPU; -1: none.
  // --cuda-graph: that of the step captured (its replays allocate nothing), if larger.
  int64_t device_peak = -1;
  ddp::obs::StepMemory phases;  // eager steps: the same by phase
};

Memory measure_memory(ddp::tools::TrainingRun& run, const ddp::obs::StepMemory& phases);

// Bytes this rank sent per timed step on each group of the run, by the group's name
// (TrainingRun::groups, ProcessGroup::bytes_sent); empty when not counted.
using GroupBytes = std::vector<std::pair<std::string, int64_t>>;

// Rank 0's result: one line (or JSON object) as the reference prints it, and with --verbose the
// stats and memory lines; `floor`: --comm-floor's replay; `bytes_per_step`: in the JSON
// ("bytes_per_step": {"world": ..., "replicate": ..., "shard": ...}) and --verbose's lines.
void print_result(const Args& args, ddp::tools::TrainingRun& run, const Memory& memory,
                  const ddp::tools::InitReport& init, const std::vector<double>& step_ms,
                  const std::optional<ddp::tools::CommFloor>& floor,
                  const GroupBytes& bytes_per_step);

// --init-only's line: every rank's init_s and init_peak_bytes, and the bound issue 60 sets for a
// sharded model: this rank's parameters (its shards) plus the largest unit whole, plus 25%.
// Collective (the plan is read on every rank); rank 0 prints.
void print_init_only(const Args& args, ddp::tools::TrainingRun& run,
                     const ddp::tools::InitReport& init);

}  // namespace ddp::tools::bench
