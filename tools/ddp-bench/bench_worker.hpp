#pragma once
// One ddp-bench worker: its run (TrainingRun), the timed steps (eager or captured), the floors,
// the traces and rank 0's report (result_report.hpp).

#include "bench_args.hpp"
#include "ddp/models/registry.hpp"

namespace ddp::tools::bench {

// The peak learning rate: --lr, else the model's own (run_flags.hpp); known before any worker
// starts, so a schedule is checked against it there.
inline double peak_lr(const Args& args) {
  return args.lr > 0 ? args.lr : ddp::models::workload_lr(args.model, args.workload);
}

// A process group is made: DDP, or a sharded style (which runs at any world size).
inline bool distributed(const Args& args) { return args.shard.chosen || args.tp > 0; }

// Runs this process's part of the benchmark; returns its exit code. Collective over the world
// when distributed(args).
int run_worker(const Args& args);

}  // namespace ddp::tools::bench
