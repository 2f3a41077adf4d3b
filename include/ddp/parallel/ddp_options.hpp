#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddp/gradients/gradient_options.hpp"

namespace ddp::parallel {

// One options model: DDPOptions holds GradientOptions, which holds buckets::PlanOptions; nothing is
// copied between layers. describe() lists every field (dotted name -> value text) for
// logging_data(), --verbose and docs/options.md (a test keeps the page and this list in step).
struct DDPOptions {
  // Default true, as PyTorch: rank 0's buffers (e.g. BatchNorm running stats) are broadcast before
  // each synchronized forward, an evaluation's under no_grad included (every rank must make it),
  // so every rank normalizes with the same statistics at eval time.
  bool broadcast_buffers = true;
  // Default true: predict the gradient-ready order from the autograd graph at the first forward and
  // bucket by it from iteration 1 (the dynamo DDPOptimizer's idea). False: PyTorch eager's way,
  // reverse registration order, then one rebuild after iteration 1 from rank 0's observed order.
  bool graph_planning = true;
  // Default empty: qualified names of parameters and buffers that are neither broadcast, checked
  // across ranks, nor reduced (rank-local state, as PyTorch's _set_params_and_buffers_to_ignore).
  std::vector<std::string> params_to_ignore;
  // Default 100, as PyTorch's DDP logger: stats are sampled in iterations 1-10, then every N-th.
  int64_t stats_every = 100;
  // Default 0 (off; PyTorch has no such check): every K-th synchronized training forward first
  // compares a checksum of every parameter (and, with broadcast_buffers, every buffer) with rank
  // 0's, one broadcast and one all-reduce of 2 values per tensor and a host read, and throws on
  // every rank naming the first tensor that differs and on how many ranks: replicas that drifted
  // apart (a rank that skipped optimizer.step(), a rank-local edit) are named instead of training
  // on silently. Its cost: docs/vision.md.
  int64_t check_replicas_every = 0;
  // Default false: when true, rank 0 prints the bucket table whenever the plan changes
  // (DDP_LOG_LEVEL=info does the same).
  bool verbose = false;
  // The gradient path: bucket views, unused parameters, static graph and the bucket caps
  // (gradients.buckets.first_bucket_cap_bytes 1 MiB, gradients.buckets.bucket_cap_bytes 25 MiB,
  // as PyTorch). See gradients/gradient_options.hpp.
  gradients::GradientOptions gradients;
};

// Every option of `options` as (dotted name, value), in declaration order, nested options
// included: "broadcast_buffers" -> "true", "gradients.buckets.bucket_cap_bytes" -> "26214400".
std::vector<std::pair<std::string, std::string>> describe(const DDPOptions& options);

struct JoinOptions {
  // Default true, as PyTorch: gradients are divided by the initial world size even when fewer
  // ranks contributed (joined ranks count as zeros). False: divide by the ranks that contributed,
  // so each step is the mean over the samples actually seen.
  bool divide_by_initial_world_size = true;
};

}  // namespace ddp::parallel
