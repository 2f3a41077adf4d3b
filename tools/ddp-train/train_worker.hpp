#pragma once
// One ddp-train worker: its process group, model and style (TrainingRun), the training loop
// (eager or captured steps, the loss log, evaluation on text, checkpoints), and rank 0's last
// lines.

#include "train_args.hpp"

namespace ddp::tools {

// Runs this process's part of the job; returns its exit code. Collective over the launcher's
// world.
int run_worker(const TrainArgs& given);

}  // namespace ddp::tools
