#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::parallel {

struct DDPOptions {
  // Default true, as PyTorch: rank 0's buffers (e.g. BatchNorm running stats) are broadcast before
  // each synchronized forward, so every rank normalizes with the same statistics at eval time.
  bool broadcast_buffers = true;
  // Default false, as PyTorch: see ReducerOptions::find_unused_parameters.
  bool find_unused_parameters = false;
  // Default false, as PyTorch: see ReducerOptions::static_graph.
  bool static_graph = false;
  // Default true: predict the gradient-ready order from the autograd graph at the first forward and
  // bucket by it from iteration 1 (the dynamo DDPOptimizer's idea). False: PyTorch eager's way,
  // reverse registration order, then one rebuild after iteration 1 from rank 0's observed order.
  bool graph_planning = true;
  // Default true: param.grad aliases the flat bucket; no copies, less memory.
  bool gradient_as_bucket_view = true;
  // Default 25, as PyTorch: cap of every bucket after the first, in MiB.
  double bucket_cap_mb = 25.0;
  // Default 1, as PyTorch: cap of the first bucket, in MiB; small so communication starts early.
  double first_bucket_cap_mb = 1.0;
  // Default empty: qualified names of parameters and buffers that are neither broadcast, checked
  // across ranks, nor reduced (rank-local state, as PyTorch's _set_params_and_buffers_to_ignore).
  std::vector<std::string> params_to_ignore;
  // Default 100, as PyTorch's DDP logger: stats are sampled in iterations 1-10, then every N-th.
  int64_t stats_every = 100;
  // Default false: when true, rank 0 prints the bucket table whenever the plan changes
  // (DDP_LOG_LEVEL=info does the same).
  bool verbose = false;
};

struct JoinOptions {
  // Default true, as PyTorch: gradients are divided by the initial world size even when fewer
  // ranks contributed (joined ranks count as zeros). False: divide by the ranks that contributed,
  // so each step is the mean over the samples actually seen.
  bool divide_by_initial_world_size = true;
};

}  // namespace ddp::parallel
