#pragma once

namespace ddp::parallel {

struct DDPOptions {
  // Default true, as PyTorch: rank 0's buffers (e.g. BatchNorm running stats) are broadcast before
  // each synchronized forward, so every rank normalizes with the same statistics at eval time.
  bool broadcast_buffers = true;
  // Default false, as PyTorch: see ReducerOptions::find_unused_parameters.
  bool find_unused_parameters = false;
  // Default true: param.grad aliases the flat bucket; no copies, less memory.
  bool gradient_as_bucket_view = true;
  // Default 25, as PyTorch: cap of every bucket after the first, in MiB.
  double bucket_cap_mb = 25.0;
  // Default 1, as PyTorch: cap of the first bucket, in MiB; small so communication starts early.
  double first_bucket_cap_mb = 1.0;
  // Default false: when true, rank 0 prints the bucket table at construction (DDP_LOG_LEVEL=info
  // does the same).
  bool verbose = false;
};

}  // namespace ddp::parallel
