#pragma once
// Deferred, sharded initialisation: a model too large for one rank is built piece by piece, and
// after each piece every rank keeps only what its style will hold between steps (its dim-0 rows of
// a sharded parameter, the whole of a replicated one), on the training device. The wrapper
// (ShardedModule, or DistributedDataParallel for REPLICATE) then takes the kept rows instead of
// splitting whole parameters, so no rank ever holds the whole model, in host or device memory.
//
//   ddp::shard::DeferredInit deferred(*pg, {DataParallelStyle::kFullyShard, device});
//   auto net = Llama(config);   // its constructor calls shard_now(piece) after each block
//   ddp::shard::FullyShardedDataParallel<Llama> model(net, pg, options);
//
// [Note: the same draws as one process] The values are bit-identical to a single process's
// construction with the same seed, because every rank still builds every piece whole, on the CPU,
// in the constructor's order, drawing from the same generator; it only drops the rows it does not
// keep as soon as the piece is built. A re-initialisation after the pieces were dropped
// (GPT-2's N(0, 0.02) over the whole model, models/normal_init.hpp) goes through fill_full,
// which fills a whole CPU temporary of one parameter (the same draws) and keeps its rows again:
// the host holds the kept rows, one piece and one parameter at most. FSDP2's meta-device path
// (build on meta, shard, to_empty, init_weights on the shards) draws different numbers on every
// rank count; this path gives every world size the same model.
//
// [Note: placeholders] libtorch's modules allocate and initialise their parameters in their
// constructors (there is no default-device context in C++), and the module, the optimizer and the
// module's own fields hold the same TensorImpl. A dropped parameter keeps its identity, its shape,
// dtype and device: its data becomes one NaN expanded to the full shape (stride 0; 1 element of
// memory). A forward through the model before it is wrapped therefore gives NaN, never plausible
// numbers; the wrapper replaces the placeholder with the parameter's shard (set_, as it does for
// every sharded parameter). Every rank checks at the wrap that all ranks built the same values:
// the checksum of each whole value (sum and sum of squares in float64 of a sample spread over it:
// a rank seeded apart differs in every value) is computed when the piece is dropped and compared as
// the broadcast's checksum is (intake/module_intake.hpp).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <optional>

#include "ddp/comm/process_group.hpp"
#include "ddp/shard/data_parallel_style.hpp"

namespace torch::nn {
class Module;
}

namespace ddp::shard {

// Which numbers fill_full writes.
enum class InitDraws {
  // Every value a single process draws, on the CPU, of which this rank keeps its rows ([Note: the
  // same draws as one process]): the same model at every world size, for the price of every rank
  // drawing the whole model (llama-8b: ~100 s before the first step).
  kOneProcess,
  // [Note: local draws] Each rank fills only what it keeps, on the device, from the device's
  // generator seeded with local_draw_seed(local_seed, turn, rank) (turn: the fill_full call's
  // number under this DeferredInit; a parameter every rank keeps whole draws with rank 0's seed,
  // so that the ranks agree): the same distributions, other numbers at every world size, as
  // FSDP2's meta-device path (to_empty, then init_weights on the shards). The generator's state
  // is restored after each fill. A constructor may skip its own draws: [Note: constructors' draws].
  kLocal,
};

struct DeferredInitOptions {
  // The style the model will be wrapped with: which parameters keep only this rank's rows
  // ([Note: styles] in shard_plan.hpp). Default fully_shard: the style that needs this most.
  DataParallelStyle style = DataParallelStyle::kFullyShard;
  // Where the kept rows, the replicated parameters and the buffers go: the training device, so
  // that the host holds no more than one piece. Default the CPU (Gloo).
  at::Device device = at::kCPU;
  // Which numbers fill_full writes. Default kOneProcess: a sharded run starts from the model a
  // single process builds with the same seed, whatever the world size.
  InitDraws draws = InitDraws::kOneProcess;
  // kLocal's seed (the same on every rank). Default 0.
  uint64_t local_seed = 0;
};

// kLocal's seed of fill_full call `turn` on `rank` (splitmix64 of the three): a pure function, so
// that a test can draw the same numbers.
uint64_t local_draw_seed(uint64_t local_seed, uint64_t turn, int rank);

// What deferred initialisation kept of one parameter: this rank's rows of dim 0 (torch.chunk's
// split over `world`: comm/flat_shards.hpp) on the device, and the checksum of the whole value
// (float64 [sum, sum of squares], NaNs as 0, of at most 65536 values spread evenly over it).
struct KeptRows {
  at::Tensor rows;
  at::Tensor checksum;
  int world = 1;
  int rank = 0;
};

// Active on the constructing thread from construction to destruction (one at a time): while it
// is, shard_now and fill_full drop and keep. The kept rows outlive it (the wrapper takes them).
class DeferredInit {
 public:
  DeferredInit(const comm::ProcessGroup& group, DeferredInitOptions options = {});
  DeferredInit(int world, int rank, DeferredInitOptions options = {});
  ~DeferredInit();
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;

  int world() const { return world_; }
  int rank() const { return rank_; }
  const DeferredInitOptions& options() const { return options_; }
  // Whether the style keeps only this rank's rows of `param` (else it keeps the whole).
  bool keeps_rows(const at::Tensor& param) const;
  // kLocal: the number of the next fill_full call (every rank makes the same calls in order).
  uint64_t next_turn() { return turn_++; }

 private:
  int world_ = 1;
  int rank_ = 0;
  DeferredInitOptions options_;
  uint64_t turn_ = 0;  // fill_full calls so far
};

// Called after a piece of a model is built (a block, an embedding, and the root at the end of the
// constructor): under an active DeferredInit, every parameter under `module` (itself included)
// that is still whole keeps this rank's rows (a placeholder left in its place) or moves whole to
// the device, and every buffer moves to the device. No-op without one: single-process code runs
// unchanged.
void shard_now(torch::nn::Module& module);

// Writes `param`'s whole value with `fill` (an in-place initialiser such as normal_): directly
// when the parameter is whole on the CPU; otherwise on a whole CPU temporary (the draws a single
// process makes), then kept as shard_now keeps it. Under InitDraws::kLocal, `fill` writes only
// what this rank keeps, on the device ([Note: local draws]). Under NoGradGuard.
void fill_full(at::Tensor& param, const std::function<void(at::Tensor&)>& fill);

// [Note: constructors' draws] Under InitDraws::kLocal the values a module's constructor draws
// (libtorch's draw every parameter whole, on the CPU) are thrown away by the fill_full that
// follows. A model that fills every weight with fill_full may skip them: it builds the module at a
// trivial size and gives each parameter unfilled(its real sizes): one NaN expanded (no memory, as a
// placeholder), which shard_now leaves so (moved to the device) and fill_full replaces with the
// rows this rank keeps. A parameter never filled trains as NaN: loud, never plausible numbers.
// llama-1b at world 4 on the CPU (the zoo's models/normal_init.hpp): init 35.4 -> 7 s a rank,
// peak 2.63 -> 1.59 GB.
//
// Whether an active DeferredInit on this thread draws locally (constructors' draws unused).
bool draws_locally();
// One NaN of `options`' dtype and device expanded to `sizes`: a parameter's value before
// fill_full writes it.
at::Tensor unfilled(at::IntArrayRef sizes, const at::TensorOptions& options);

// Whether `param` is a placeholder whose rows deferred initialisation kept.
bool is_deferred(const at::Tensor& param);
// The kept rows of `param` (looked up, not taken): nullopt when it is not deferred.
std::optional<KeptRows> kept_rows(const at::Tensor& param);
// Takes them (the wrapper, once it holds them in its shard): nullopt when it is not deferred.
std::optional<KeptRows> take_kept_rows(const at::Tensor& param);

}  // namespace ddp::shard
