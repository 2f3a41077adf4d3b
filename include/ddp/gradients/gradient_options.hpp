#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"

namespace ddp::gradients {

struct GradientOptions {
  // Default true (PyTorch's default is false; we choose true): param.grad is a view into the flat
  // bucket, so no copy in or out of the bucket and no second copy of the gradients in memory.
  bool gradient_as_bucket_view = true;
  // Default false, as PyTorch: walking the autograd graph after every forward costs time. Turn it
  // on when some parameters take no part in some forwards; they then count as ready with a zero
  // contribution (or with the gradient they already hold, e.g. from no_sync steps).
  bool find_unused_parameters = false;
  // Default false, as PyTorch. When the set of used parameters is the same every iteration, the
  // first iteration records it and later ones skip the graph walk and the used-map all-reduce. A
  // later change of that set is an error that says so.
  bool static_graph = false;
  // Default true: a bucket is launched the moment its last gradient is ready, so communication
  // runs under the rest of backward. False launches every bucket at the end of backward, as if
  // there were no overlap: slower, and only for attribution (what overlap hides, measured in
  // docs/benchmarks.md); the gradients are the same.
  bool overlap = true;
  // Default unset: on where the backend reduces on the device's stream (NCCL), off elsewhere
  // (Gloo's coalesced all-reduce flattens the tensors into one buffer itself, so nothing is saved,
  // and CPU runs keep the flat reduction's summation order). A bucket whose gradients all arrived
  // in tensors of their own (after zero_grad(set_to_none), PyTorch's default) is reduced where
  // they are, in one grouped collective over those tensors, instead of being copied into the
  // bucket's flat storage first: no copy kernel on the compute stream and param.grad stays
  // autograd's tensor. Measured on 4x H200 (docs/benchmarks.md, "4 GPUs"): gpt2-medium 1.0-1.3 ms
  // of a 60 ms step faster at worlds 2 and 4. The built-in average only (a comm hook reads the
  // flat GradBucket::buffer). See [Note: in-place reduction] in bucket_runtime.hpp.
  std::optional<bool> reduce_in_place;
  // Bucket caps (PyTorch's defaults: 1 MiB first, 25 MiB after). The plan starts in reverse
  // registration order and is rebuilt once, after iteration 1, from the order rank 0 observed,
  // unless GradientRuntime::set_predicted_order supplies the order at the first forward
  // (graph planning, done by DistributedDataParallel); `buckets.order` is set by the reducer, not
  // by users.
  buckets::PlanOptions buckets;
};

// (name, value) for every field, names prefixed with `prefix` (e.g. "gradients.").
void describe(const GradientOptions& options, const std::string& prefix,
              std::vector<std::pair<std::string, std::string>>& out);

}  // namespace ddp::gradients
