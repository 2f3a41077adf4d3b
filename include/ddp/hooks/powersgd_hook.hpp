#pragma once
// PowerSGD gradient compression (Vogels et al., 2019, https://arxiv.org/abs/1905.13727) as a comm
// hook: PyTorch's non-batched `powerSGD_hook` (ddp_comm_hooks/powerSGD_hook.py), natively.
//
// Per bucket, once bucket.iteration >= start_powerSGD_iter, each parameter gradient that is worth
// it is viewed as a matrix M (shape[0] x numel/shape[0]) and replaced by a rank-r approximation
// P Q^T that costs (n + m) * r elements on the wire instead of n * m:
//
//   M += residual            (error feedback: what earlier compressions dropped, kept per bucket)
//   P  = M Q                 (Q: seeded random on first use, the previous Q when warm_start)
//   all-reduce P             (one collective for all P of the bucket; no division, see below)
//   P  = orthogonalize(P)    (Gram-Schmidt; scaling P by 1/world would be undone here anyway)
//   Q  = M^T P
//   all-reduce Q; Q /= world (one collective for all Q of the bucket)
//   M  = P Q^T               (written into the bucket: the averaged approximation)
//   residual = M_input - M   (M_input includes the previous residual)
//
// Vectors (biases), zero-sized gradients and matrices too small to gain min_compression_rate are
// packed into one flat tensor, averaged with one all-reduce and written back exactly.

#include <cstdint>

#include "ddp/comm/process_group.hpp"
#include "ddp/hooks/comm_hook.hpp"

namespace ddp::hooks {

struct PowerSGDOptions {
  // r, the rank of each approximation (capped at min(n, m) per matrix). Default 1, PyTorch's: the
  // strongest compression; raise by factors of 2 (1, 2, 4, ...) until accuracy is acceptable.
  int64_t matrix_approximation_rank = 1;
  // Plain all-reduce (average) while bucket.iteration < this. Default 10, PyTorch's: early training
  // is the most sensitive to biased gradients; PyTorch suggests ~10% of the training steps. 0 and 1
  // are allowed: PyTorch insists on >= 2 because its buckets are rebuilt after iteration 1; ours
  // may be too (without graph planning), and the hook then carries each parameter's residual and
  // Q into its new bucket (GradBucket::plan_epoch; [Note: plan changes] in the source).
  int64_t start_powerSGD_iter = 10;
  // A matrix n x m is compressed only if (n + m) * r * rate < n * m (strict, as PyTorch's
  // _should_compress): below that the matmuls and extra round trip cost more than the bytes saved.
  // Default 2, PyTorch's. Must be >= 0.
  int64_t min_compression_rate = 2;
  // Add each bucket's residual before compressing and keep the new one. Default true: PowerSGD is a
  // biased compressor; without error feedback the dropped part is lost for good and training
  // usually loses accuracy. Costs one bucket-sized copy per bucket.
  bool use_error_feedback = true;
  // Reuse each bucket's Q from the previous iteration (one power-iteration step per training step)
  // instead of a fresh random Q. Default true: better approximations for the same r, at the cost of
  // keeping P and Q per bucket.
  bool warm_start = true;
  // Seeds Q's random initialization. Q for (bucket index, iteration) comes from a CPU generator
  // seeded with a mix of (seed, bucket index, iteration), so it is identical on every rank by
  // construction and differs between buckets and iterations. Default 0, as PyTorch's random_seed.
  uint64_t seed = 0;
  // Added to each column norm in the Gram-Schmidt step. Default 0, PyTorch's. With 0, an all-zero
  // column (e.g. a layer whose gradient is zero) is left zero instead of becoming NaN as in
  // PyTorch; a positive epsilon behaves exactly as PyTorch's. Must be >= 0.
  double orthogonalization_epsilon = 0;
};

// The PowerSGD hook for one model's buckets: it keeps per-bucket-index state (residual, P, Q), so
// each DistributedDataParallel needs its own. A bucket whose layout changes under an index within
// one plan epoch is an error, not a silent reset. Throws (TORCH_CHECK) on a null `pg` or
// out-of-range options.
CommHookPtr powersgd_hook(comm::ProcessGroupPtr pg, PowerSGDOptions options = {});

// In place: makes the columns of the 2-D floating-point `matrix` orthonormal, column by column
// (modified Gram-Schmidt, PyTorch's _orthogonalize). Each column is divided by (norm + epsilon);
// with epsilon 0, a zero column stays zero. Needs cols <= rows for orthonormal output. Exposed for
// tests.
void orthogonalize(const at::Tensor& matrix, double epsilon = 0);

// Whether an n x m matrix is worth approximating at rank r (already capped at min(n, m)):
// (n + m) * r * min_compression_rate < n * m. Pure; exposed for tests.
bool should_compress(int64_t rows, int64_t cols, int64_t rank, int64_t min_compression_rate);

}  // namespace ddp::hooks
