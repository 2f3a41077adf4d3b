#pragma once
// ddp-bench's flags: the shared run flags (tools/common/training_run.hpp) and the bench's own.

#include <string>

#include "common/training_run.hpp"

namespace ddp::tools::bench {

// The shared run flags (tools/common/training_run.hpp) with this tool's defaults: --model toy and
// SGD at --lr 0.01 (momentum 0), as bench/reference/torch_ddp.py. With --grad-accum N a step runs
// N micro-batches of --batch-size per rank (an --inputs batch is split into N).
struct Args : ddp::tools::TrainingFlags {
  Args() {
    model = "toy";
    lr = 0.01;
  }
  bool toy_model = false;
  int repeat = 10;
  int warmup = 3;
  bool json = false;
  // --init-only: build, shard and wrap the model, report the initialisation, take no step (a
  // large model's initialisation measured where its steps would not fit).
  bool init_only = false;
  bool profile = false;
  std::string trace_file = "profile.json";
  // --kernel-trace FILE: kKernelTraceSteps more steps after the timed ones, untimed, traced by
  // Kineto (obs/kernel_trace.hpp); rank r > 0 writes FILE.rank<r>.
  std::string kernel_trace;
  // --no-comm: every collective a no-op (comm/fake_backend.hpp): the step's compute alone at this
  // world size, its shards and memory; the losses are not checked (they are wrong), and the other
  // ranks' init reports read as 0 (gathered through the same no-op collectives).
  bool no_comm = false;
  // --comm-floor N: after the timed steps, the last timed step's collectives replayed N times
  // back to back with no compute (comm_floor.hpp); 0: none.
  int comm_floor = 0;
  std::string graph_dot;
  std::string init_params;
  std::string inputs;
  std::string save_params;
};

}  // namespace ddp::tools::bench
