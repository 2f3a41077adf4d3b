#include "ddp/hooks/powersgd_hook.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/hooks/default_hooks.hpp"
#include "ddp/obs/log.hpp"

namespace ddp::hooks {

// [Note: PowerSGD runs synchronously]
// A compressing run() issues its collectives and waits for them (pg->wait, bounded by the process
// group's timeout) before returning completed_future(bucket.buffer). PyTorch chains the three
// steps as future callbacks instead; here that would let step 2 of bucket k (the P all-reduce,
// issued from a callback thread) race with step 1 of bucket k+1 (issued by the
// GradientRuntime), and the order of collectives could then differ between ranks: a hang or
// silently mixed data. Running synchronously gives up overlap of this hook's communication with the
// rest of backward in exchange for a collective order that is fixed by construction:
//
//   run(bucket k):   [cat+all-reduce uncompressed]---------------------wait  copy back
//                    [P = MQ][all-reduce P]wait [orth P][Q = M^T P][all-reduce Q]wait [M = PQ^T]
//   run(bucket k+1):                                                               [...]
//
// The uncompressed all-reduce is still overlapped with the P/Q work of its own bucket. Warm-up
// iterations (bucket.iteration < start_powerSGD_iter) delegate to allreduce_hook, which is
// asynchronous: its single collective is issued inside run(), so the order stays fixed there too.

namespace {

// One matrix of a bucket that is approximated: a view into the bucket buffer, and where its P
// (n x rank) and Q (m x rank) live in the bucket's packed P and Q memory.
struct MatrixSlot {
  at::Tensor matrix;  // n x m view into bucket.buffer
  size_t param = 0;   // index into bucket.params
  int64_t rank = 0;   // min(n, m, matrix_approximation_rank)
  int64_t p_offset = 0;
  int64_t q_offset = 0;
};

// How one bucket splits into compressed matrices and uncompressed tensors. A pure function of the
// bucket's layout and the options, hence identical on every rank: which collectives run (and in
// what order) depends only on it.
struct BucketSplit {
  std::vector<MatrixSlot> matrices;
  std::vector<at::Tensor> uncompressed;  // flat views into bucket.buffer
  int64_t uncompressed_numel = 0;
  int64_t p_numel = 0;  // all Ps of the bucket, packed
  int64_t q_numel = 0;  // all Qs of the bucket, packed
};

// What the hook remembers about one bucket index between iterations.
struct BucketState {
  // The layout the state was made for; checked on every call because residual, P and Q are
  // meaningless for any other layout.
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;
  std::vector<int64_t> rows;  // shape[0] of each parameter, -1 for 0-D and 1-D ones
  // Which parameter each slot holds, to carry residual and Q over a plan change (see
  // [Note: plan changes]). Identity only: never dereferenced.
  std::vector<const c10::TensorImpl*> param_ids;
  // Per compressed matrix: its parameter and where its Q lives in q_memory.
  struct QSlot {
    const c10::TensorImpl* param;
    int64_t offset;
    int64_t numel;
  };
  std::vector<QSlot> q_slots;
  // With error feedback: bucket-sized; input minus output of the last compressed iteration.
  // Undefined until the bucket is first compressed (then it is zero, as PyTorch's).
  at::Tensor residual;
  // Packed P and Q memory of the bucket (p_numel, q_numel elements), allocated on first use and
  // reused. After a compressed iteration q_memory holds the averaged Q that warm start reuses.
  at::Tensor p_memory;
  at::Tensor q_memory;
  bool q_initialized = false;  // q_memory holds a previous iteration's Q
};

// SplitMix64's finalizer: decorrelates nearby inputs (bucket 0/1, iteration 10/11) so that the
// seeds of different (bucket, iteration) pairs give unrelated Q initializations.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::vector<int64_t> row_counts(const GradBucket& bucket) {
  std::vector<int64_t> rows;
  rows.reserve(bucket.params.size());
  for (const auto& param : bucket.params) rows.push_back(param.dim() >= 2 ? param.size(0) : -1);
  return rows;
}

std::string join(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

class PowerSGDHook final : public CommHook {
 public:
  PowerSGDHook(comm::ProcessGroupPtr pg, PowerSGDOptions options)
      : pg_(std::move(pg)), options_(options), warmup_(allreduce_hook(pg_)) {}

  c10::intrusive_ptr<c10::ivalue::Future> run(GradBucket& bucket) override {
    TORCH_CHECK(!bucket.reduce_scatter,
                "ddp: comm hook 'powersgd' cannot reduce-scatter a FULLY_SHARD unit (bucket ",
                bucket.index,
                "): its low-rank factors are all-reduced whole; use allreduce, fp16_compress or "
                "bf16_compress under fully_shard and default");
    TORCH_CHECK(!bucket.cross_replica,
                "ddp: comm hook 'powersgd' cannot average a unit's gradient shard across "
                "replicas (hybrid sharding, bucket ",
                bucket.index,
                "): its low-rank factors need whole gradient matrices; use allreduce, "
                "fp16_compress or bf16_compress");
    check_bucket(bucket);
    if (bucket.iteration < options_.start_powerSGD_iter) return warmup_->run(bucket);
    std::lock_guard<std::mutex> lock(mutex_);  // state_ is shared by all buckets
    if (bucket.plan_epoch != plan_epoch_) carry_over_plan_change(bucket.plan_epoch);
    BucketSplit parts = split(bucket);
    BucketState& state = state_for(bucket, parts);  // a layout error keeps the old state
    try {
      compress(bucket, parts, state);
    } catch (...) {
      // A failed collective leaves this bucket's residual/P/Q half-updated: forget them rather
      // than feed a corrupt residual into a later iteration.
      state_.erase(bucket.index);
      throw;
    }
    return completed_future(bucket.buffer);
  }

  std::string name() const override { return "powersgd"; }

 private:
  static void check_bucket(const GradBucket& bucket) {
    const at::Tensor& buffer = bucket.buffer;
    TORCH_CHECK(buffer.defined() && buffer.dim() == 1 && buffer.is_contiguous() &&
                    at::isFloatingType(buffer.scalar_type()),
                "ddp: powersgd_hook needs a contiguous 1-D floating-point bucket buffer; bucket ",
                bucket.index, " has ", buffer.defined() ? buffer.toString() : "none");
    TORCH_CHECK(bucket.offsets.size() == bucket.params.size() &&
                    bucket.lengths.size() == bucket.params.size(),
                "ddp: powersgd_hook: bucket ", bucket.index, " has ", bucket.params.size(),
                " parameters but ", bucket.offsets.size(), " offsets and ", bucket.lengths.size(),
                " lengths");
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      TORCH_CHECK(bucket.lengths[i] == bucket.params[i].numel() && bucket.offsets[i] >= 0 &&
                      bucket.offsets[i] + bucket.lengths[i] <= buffer.numel(),
                  "ddp: powersgd_hook: parameter ", i, " of bucket ", bucket.index, " (numel ",
                  bucket.params[i].numel(), ") does not fit its slot: offset ", bucket.offsets[i],
                  ", length ", bucket.lengths[i], " in a buffer of ", buffer.numel());
    }
  }

  BucketSplit split(GradBucket& bucket) const {
    BucketSplit out;
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      at::Tensor flat = bucket.buffer.narrow(0, bucket.offsets[i], bucket.lengths[i]);
      const at::Tensor& param = bucket.params[i];
      // 0-D and 1-D tensors (biases, norms' scales) always go uncompressed: as n x 1 matrices they
      // would gain nothing, and they are exact this way whatever min_compression_rate says.
      if (param.dim() >= 2 && param.numel() > 0) {
        const int64_t n = param.size(0);
        const int64_t m = param.numel() / n;
        const int64_t rank = std::min({n, m, options_.matrix_approximation_rank});
        if (should_compress(n, m, rank, options_.min_compression_rate)) {
          out.matrices.push_back({flat.view({n, m}), i, rank, out.p_numel, out.q_numel});
          out.p_numel += n * rank;
          out.q_numel += m * rank;
          continue;
        }
      }
      out.uncompressed.push_back(flat);
      out.uncompressed_numel += flat.numel();
    }
    return out;
  }

  // The bucket's state, made on its first compressed iteration; its layout must not change.
  BucketState& state_for(const GradBucket& bucket, const BucketSplit& split) {
    auto it = state_.find(bucket.index);
    if (it == state_.end()) {
      BucketState state;
      state.numel = bucket.buffer.numel();
      state.dtype = bucket.buffer.scalar_type();
      state.device = bucket.buffer.device();
      state.offsets = bucket.offsets;
      state.lengths = bucket.lengths;
      state.rows = row_counts(bucket);
      for (const auto& param : bucket.params)
        state.param_ids.push_back(param.unsafeGetTensorImpl());
      for (const auto& slot : split.matrices) {
        state.q_slots.push_back({bucket.params[slot.param].unsafeGetTensorImpl(), slot.q_offset,
                                 slot.matrix.size(1) * slot.rank});
      }
      const int64_t sent = split.uncompressed_numel + split.p_numel + split.q_numel;
      obs::log(obs::LogLevel::kInfo, pg_->rank(),
               "powersgd: bucket " + std::to_string(bucket.index) + ": " +
                   std::to_string(split.matrices.size()) + " matrices compressed, " +
                   std::to_string(split.uncompressed.size()) + " tensors uncompressed; " +
                   std::to_string(state.numel) + " elements -> " + std::to_string(sent) +
                   " on the wire");
      it = state_.emplace(bucket.index, std::move(state)).first;
      return it->second;
    }
    BucketState& state = it->second;
    TORCH_CHECK(state.numel == bucket.buffer.numel() &&
                    state.dtype == bucket.buffer.scalar_type() &&
                    state.device == bucket.buffer.device() && state.offsets == bucket.offsets &&
                    state.lengths == bucket.lengths && state.rows == row_counts(bucket),
                "ddp: powersgd_hook: bucket ", bucket.index, " changed layout (was ", state.numel,
                " elements, lengths ", join(state.lengths), "; now ", bucket.buffer.numel(),
                " elements, lengths ", join(bucket.lengths),
                "). The hook keeps a residual and Q per bucket index, so one hook serves one "
                "model's buckets: make a new powersgd_hook for another model.");
    return state;
  }

  // [Note: plan changes] The GradientRuntime may change its bucket plan once (graph planning
  // at the first forward, or without it the rebuild after iteration 1 from the observed order), so
  // a bucket index can come back holding other parameters at other offsets. PyTorch asks for
  // start_powerSGD_iter >= 2 to avoid meeting this; here each parameter's residual and Q move with
  // the parameter: they are cut out of the old buckets' state, keyed by the parameter, and put
  // into the new buckets' state when those are first compressed. The result is what it would have
  // been had the parameter been in its new bucket from the start.
  void carry_over_plan_change(int64_t epoch) {
    for (auto& [index, state] : state_) {
      if (state.residual.defined()) {
        for (size_t i = 0; i < state.param_ids.size(); ++i) {
          carried_residual_[state.param_ids[i]] =
              state.residual.narrow(0, state.offsets[i], state.lengths[i]).clone();
        }
      }
      if (state.q_initialized) {
        for (const auto& slot : state.q_slots) {
          carried_q_[slot.param] = state.q_memory.narrow(0, slot.offset, slot.numel).clone();
        }
      }
    }
    state_.clear();
    plan_epoch_ = epoch;
  }

  // A new bucket's first compressed iteration after a plan change: the residual its parameters
  // had in their old buckets (zeros for any without one). Undefined when nothing was carried.
  at::Tensor carried_residual(const GradBucket& bucket) {
    if (carried_residual_.empty()) return {};
    at::Tensor residual;
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      auto it = carried_residual_.find(bucket.params[i].unsafeGetTensorImpl());
      if (it == carried_residual_.end()) continue;
      if (!residual.defined()) residual = at::zeros_like(bucket.buffer);
      residual.narrow(0, bucket.offsets[i], bucket.lengths[i]).copy_(it->second);
      carried_residual_.erase(it);
    }
    return residual;
  }

  // Fills every Q of the bucket from a CPU generator seeded with (seed, bucket index, iteration):
  // the same values on every rank, in matrix order, whatever device the bucket is on.
  void randomize(const GradBucket& bucket, const std::vector<at::Tensor>& qs) const {
    const uint64_t seed = mix64(mix64(mix64(options_.seed) ^ static_cast<uint64_t>(bucket.index)) ^
                                static_cast<uint64_t>(bucket.iteration));
    at::Generator generator = at::detail::createCPUGenerator(seed);
    for (const auto& q : qs) {
      // Drawn in fp32 on the CPU and copied: the same stream for every dtype and device.
      q.copy_(at::randn(q.sizes(), generator, at::TensorOptions().dtype(at::kFloat)));
    }
  }

  void compress(GradBucket& bucket, BucketSplit& parts, BucketState& state) {
    at::Tensor& buffer = bucket.buffer;
    const int world = pg_->world_size();
    const std::string where = " of bucket " + std::to_string(bucket.index);

    // Error feedback: M_input = gradient + residual; the residual slot keeps M_input until the
    // output is known, then becomes M_input - output.
    if (options_.use_error_feedback) {
      if (!state.residual.defined()) state.residual = carried_residual(bucket);
      if (state.residual.defined()) {
        buffer.add_(state.residual);
        state.residual.copy_(buffer);
      } else {
        state.residual = buffer.clone();
      }
    }

    // 1. Uncompressed tensors: packed, averaged, all-reduced while the matrices are worked on.
    //    Divided before the sum, as allreduce_hook does, so these values match its output.
    //    Collectives with nothing to send are skipped: the split is identical on every rank, so
    //    every rank skips the same ones.
    at::Tensor packed;
    c10::intrusive_ptr<c10d::Work> packed_work;
    if (!parts.uncompressed.empty() && parts.uncompressed_numel > 0) {
      packed = at::cat(parts.uncompressed).div_(world);
      packed_work = pg_->allreduce_sum_async(packed);
    }

    std::vector<at::Tensor> ps;
    std::vector<at::Tensor> qs;
    c10::intrusive_ptr<c10d::Work> q_work;
    if (!parts.matrices.empty()) {
      if (!state.p_memory.defined()) {
        state.p_memory = at::empty({parts.p_numel}, buffer.options());
        state.q_memory = at::empty({parts.q_numel}, buffer.options());
      }
      for (const auto& slot : parts.matrices) {
        const int64_t n = slot.matrix.size(0);
        const int64_t m = slot.matrix.size(1);
        ps.push_back(state.p_memory.narrow(0, slot.p_offset, n * slot.rank).view({n, slot.rank}));
        qs.push_back(state.q_memory.narrow(0, slot.q_offset, m * slot.rank).view({m, slot.rank}));
      }
      if (!options_.warm_start || !state.q_initialized) randomize(bucket, qs);
      if (options_.warm_start && !state.q_initialized) {
        for (size_t i = 0; i < qs.size(); ++i) {  // a plan change keeps each matrix's Q
          auto it = carried_q_.find(bucket.params[parts.matrices[i].param].unsafeGetTensorImpl());
          if (it == carried_q_.end() || it->second.numel() != qs[i].numel()) continue;
          qs[i].view({-1}).copy_(it->second);
          carried_q_.erase(it);
        }
      }
      for (const auto& q : qs) orthogonalize(q, options_.orthogonalization_epsilon);

      // 2. P = M Q, all-reduced (summed: orthogonalization removes any common scale).
      for (size_t i = 0; i < ps.size(); ++i) at::mm_out(ps[i], parts.matrices[i].matrix, qs[i]);
      pg_->wait(pg_->allreduce_sum_async(state.p_memory), "powersgd all-reduce of P" + where);
      for (const auto& p : ps) orthogonalize(p, options_.orthogonalization_epsilon);

      // 3. Q = M^T P, all-reduced and averaged.
      for (size_t i = 0; i < qs.size(); ++i) {
        at::mm_out(qs[i], parts.matrices[i].matrix.t(), ps[i]);
      }
      q_work = pg_->allreduce_sum_async(state.q_memory);
    }

    if (packed_work) {
      pg_->wait(packed_work, "powersgd all-reduce of uncompressed tensors" + where);
      int64_t offset = 0;
      for (auto& flat : parts.uncompressed) {
        flat.copy_(packed.narrow(0, offset, flat.numel()));
        offset += flat.numel();
      }
    }

    if (q_work) {
      pg_->wait(q_work, "powersgd all-reduce of Q" + where);
      state.q_memory.div_(world);
      // 4. M_approx = P Q^T, written over the bucket's matrix views.
      for (size_t i = 0; i < ps.size(); ++i) {
        at::Tensor& matrix = parts.matrices[i].matrix;
        at::mm_out(matrix, ps[i], qs[i].t());
      }
      state.q_initialized = true;
    }

    // residual = M_input - output, over the whole buffer as PyTorch does. For uncompressed tensors
    // that is local - average, which sums to zero over the ranks and so leaves later averages
    // unchanged.
    if (options_.use_error_feedback) state.residual.sub_(buffer);
  }

  comm::ProcessGroupPtr pg_;
  PowerSGDOptions options_;
  CommHookPtr warmup_;  // the plain average for iterations before start_powerSGD_iter
  std::mutex mutex_;
  // Per bucket index; filled on a bucket's first compressed iteration, kept until the plan
  // changes (see [Note: plan changes]).
  std::unordered_map<size_t, BucketState> state_;
  int64_t plan_epoch_ = 0;  // the GradBucket::plan_epoch state_ was made for
  // Per parameter, between a plan change and its new bucket's first compressed iteration.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> carried_residual_;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> carried_q_;
};

}  // namespace

void orthogonalize(const at::Tensor& matrix, double epsilon) {
  TORCH_CHECK(matrix.dim() == 2 && at::isFloatingType(matrix.scalar_type()),
              "ddp: orthogonalize needs a 2-D floating-point matrix, got ", matrix.toString(),
              " of shape ", matrix.sizes());
  TORCH_CHECK(epsilon >= 0, "ddp: orthogonalize: epsilon must be >= 0, got ", epsilon);
  const int64_t cols = matrix.size(1);
  for (int64_t i = 0; i < cols; ++i) {
    at::Tensor col = matrix.narrow(1, i, 1);
    at::Tensor norm = col.norm();
    if (epsilon == 0) {
      // A zero column stays zero rather than becoming 0/0 = NaN (PyTorch's behaviour). Done on
      // the device, without reading the norm back: no synchronization per column.
      norm.masked_fill_(norm == 0, 1);
    } else {
      norm.add_(epsilon);
    }
    col.div_(norm);
    if (i + 1 < cols) {
      at::Tensor rest = matrix.narrow(1, i + 1, cols - i - 1);
      rest.sub_((col * rest).sum(0, /*keepdim=*/true) * col);
    }
  }
}

bool should_compress(int64_t rows, int64_t cols, int64_t rank, int64_t min_compression_rate) {
  return (rows + cols) * rank * min_compression_rate < rows * cols;
}

CommHookPtr powersgd_hook(comm::ProcessGroupPtr pg, PowerSGDOptions options) {
  TORCH_CHECK(options.matrix_approximation_rank >= 1,
              "ddp: powersgd_hook: matrix_approximation_rank must be >= 1, got ",
              options.matrix_approximation_rank);
  TORCH_CHECK(options.start_powerSGD_iter >= 0,
              "ddp: powersgd_hook: start_powerSGD_iter must be >= 0, got ",
              options.start_powerSGD_iter);
  TORCH_CHECK(options.min_compression_rate >= 0,
              "ddp: powersgd_hook: min_compression_rate must be >= 0, got ",
              options.min_compression_rate);
  TORCH_CHECK(options.orthogonalization_epsilon >= 0,
              "ddp: powersgd_hook: orthogonalization_epsilon must be >= 0, got ",
              options.orthogonalization_epsilon);
  TORCH_CHECK(pg, "ddp: powersgd_hook needs a process group, got null");
  return std::make_shared<PowerSGDHook>(std::move(pg), options);
}

}  // namespace ddp::hooks
