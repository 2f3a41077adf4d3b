#include "ddp/shard/deferred_init.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <limits>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ddp/comm/flat_shards.hpp"
#include "ddp/shard/shard_plan.hpp"

namespace ddp::shard {
namespace {

thread_local DeferredInit* active = nullptr;

// The kept rows of every placeholder in the process, by parameter. An entry whose parameter died
// (a weight replaced by a tied one) is dropped at the next insertion: the entry must not keep the
// rows of a parameter nobody can wrap.
class KeptStore {
 public:
  void put(const at::Tensor& param, KeptRows rows) {
    std::lock_guard<std::mutex> lock(mutex_);
    prune_locked();
    entries_.erase(param.unsafeGetTensorImpl());
    entries_.emplace(
        param.unsafeGetTensorImpl(),
        Entry{c10::weak_intrusive_ptr<c10::TensorImpl>(param.getIntrusivePtr()), std::move(rows)});
  }
  void prune() {
    std::lock_guard<std::mutex> lock(mutex_);
    prune_locked();
  }
  std::optional<KeptRows> find(const at::Tensor& param, bool take) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = entries_.find(param.unsafeGetTensorImpl());
    if (it == entries_.end() || it->second.owner.expired()) return std::nullopt;
    KeptRows out = it->second.rows;
    if (take) entries_.erase(it);
    return out;
  }

 private:
  void prune_locked() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.owner.expired() ? entries_.erase(it) : std::next(it);
    }
  }
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> owner;
    KeptRows rows;
  };
  std::mutex mutex_;
  std::unordered_map<const c10::TensorImpl*, Entry> entries_;
};

KeptStore& store() {
  static KeptStore* instance = new KeptStore();  // never destroyed: used by static teardown
  return *instance;
}

// float64 [sum, sum of squares] (NaNs as 0) of a sample of `whole`: at most kSample values spread
// evenly over it. Ranks seeded apart differ in every value, so a sample finds them; summing every
// value (5 passes over a float64 copy) made an 8 B model's initialisation several times slower.
at::Tensor sampled_checksum(const at::Tensor& whole) {
  constexpr int64_t kSample = int64_t{1} << 16;
  const at::Tensor flat = whole.detach().reshape({-1});
  const int64_t step = std::max<int64_t>(1, flat.numel() / kSample);
  const at::Tensor values = at::nan_to_num(flat.slice(0, 0, flat.numel(), step).to(at::kDouble));
  return at::stack({values.sum(), values.square().sum()});
}

// One NaN of `param`'s dtype on `device`, expanded to its shape: [Note: placeholders].
at::Tensor placeholder(const at::Tensor& param, at::Device device) {
  return unfilled(param.sizes(), param.options().device(device));
}

// A value from unfilled() (or a placeholder): every element the same memory.
bool is_unfilled(const at::Tensor& param) {
  const auto strides = param.strides();
  return param.numel() > 1 &&
         std::all_of(strides.begin(), strides.end(), [](int64_t s) { return s == 0; });
}

// Keeps this rank's rows of `whole` (the value of `param`, anywhere) and leaves a placeholder.
void keep_rows(const DeferredInit& init, at::Tensor& param, const at::Tensor& whole) {
  const bool placed = is_deferred(param) && param.device() == init.options().device;
  store().find(param, /*take=*/true);  // the rows kept before go first: one copy at a time
  const int64_t rows = whole.size(0);
  const comm::FlatShards split{rows, init.world()};
  const int64_t mine = split.length(init.rank());
  // A copy of its own: a view would keep the whole value's storage alive.
  const at::Tensor view = whole.narrow(0, split.offset(init.rank()), mine);
  at::Tensor kept =
      at::empty(view.sizes(), view.options().device(init.options().device)).copy_(view);
  store().put(param, KeptRows{kept, sampled_checksum(whole), init.world(), init.rank()});
  if (!placed) param.set_data(placeholder(param, init.options().device));
}

// shard_now's work on one parameter that may already be dropped.
void keep(const DeferredInit& init, at::Tensor& param) {
  if (is_deferred(param)) return;
  if (is_unfilled(param)) {
    // Nothing drawn yet ([Note: constructors' draws]): it stays one NaN, on the device, until
    // fill_full gives it what this rank keeps. Keeping NaN rows first would fault in every page
    // of them twice (llama-1b at world 1: a fifth of the initialisation cleared pages).
    if (param.device() != init.options().device) {
      param.set_data(placeholder(param, init.options().device));
    }
    return;
  }
  if (init.keeps_rows(param)) {
    keep_rows(init, param, param.detach());
    return;
  }
  if (param.device() != init.options().device) {
    param.set_data(param.detach().to(init.options().device));
  }
}

// The whole values of a dropped piece were freed, but glibc keeps freed blocks below its mmap
// threshold (up to 32 MB: most of a block's weights) in the heap, resident, between the kept
// rows; measured on llama-1b at world 4 that was ~0.4 GB a rank above its shards. malloc_trim
// returns the free pages to the system (a few ms a piece).
void give_back_freed_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The default generator of a device seeded for one fill and put back as it was after it, so that
// the model's construction and the program's later draws see the state they would without it.
class SeededGenerator {
 public:
  SeededGenerator(const at::Device& device, uint64_t seed)
      : generator_(at::globalContext().defaultGenerator(device)) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    saved_ = generator_.get_state();
    generator_.set_current_seed(seed);
  }
  ~SeededGenerator() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(saved_);
  }
  SeededGenerator(const SeededGenerator&) = delete;
  SeededGenerator& operator=(const SeededGenerator&) = delete;

 private:
  at::Generator generator_;
  at::Tensor saved_;
};

// fill_full under InitDraws::kLocal: [Note: local draws].
void fill_local(DeferredInit& init, at::Tensor& param, const std::function<void(at::Tensor&)>& fill,
                bool deferred) {
  const uint64_t turn = init.next_turn();
  const uint64_t seed = init.options().local_seed;
  const at::Device device = init.options().device;
  if (!deferred && (param.dim() == 0 || !init.keeps_rows(param))) {
    // Every rank keeps it whole: rank 0's numbers on every rank.
    if (is_unfilled(param)) {
      param.set_data(at::empty(param.sizes(), param.options().device(device)));
    } else if (param.device() != device) {
      param.set_data(param.detach().to(device));
    }
    const SeededGenerator seeded(device, local_draw_seed(seed, turn, 0));
    fill(param);
    return;
  }
  store().find(param, /*take=*/true);  // the rows kept before go first
  const comm::FlatShards split{param.size(0), init.world()};
  std::vector<int64_t> sizes = param.sizes().vec();
  sizes[0] = split.length(init.rank());
  at::Tensor kept = at::empty(sizes, param.options().device(device));
  {
    const SeededGenerator seeded(device, local_draw_seed(seed, turn, init.rank()));
    fill(kept);
  }
  // No whole value to take a checksum of: the seed and the turn stand for it, compared across
  // the ranks at the wrap as a checksum is (a rank that filled in another order is named).
  const at::Tensor stands_for =
      at::tensor({static_cast<double>(seed & ((uint64_t{1} << 52) - 1)), static_cast<double>(turn)},
                 at::TensorOptions().dtype(at::kDouble));
  const bool placed = deferred && param.device() == device;
  store().put(param, KeptRows{kept, stands_for, init.world(), init.rank()});
  if (!placed) param.set_data(placeholder(param, device));
}

}  // namespace

uint64_t local_draw_seed(uint64_t local_seed, uint64_t turn, int rank) {
  return splitmix64(splitmix64(splitmix64(local_seed) ^ turn) ^ static_cast<uint64_t>(rank));
}

DeferredInit::DeferredInit(const comm::ProcessGroup& group, DeferredInitOptions options)
    : DeferredInit(group.world_size(), group.rank(), options) {}

DeferredInit::DeferredInit(int world, int rank, DeferredInitOptions options)
    : world_(world), rank_(rank), options_(options) {
  TORCH_CHECK(world >= 1 && rank >= 0 && rank < world, "ddp: DeferredInit: rank ", rank,
              " of world ", world);
  TORCH_CHECK(active == nullptr,
              "ddp: DeferredInit: another deferred initialisation is active on this thread; "
              "build one model at a time");
  active = this;
}

DeferredInit::~DeferredInit() { active = nullptr; }

bool DeferredInit::keeps_rows(const at::Tensor& param) const {
  ParamShape shape("", param.sizes().vec(), param.scalar_type());
  shape.trainable = param.requires_grad();
  return style_shards(shape, world_, options_.style);
}

void shard_now(torch::nn::Module& module) {
  const DeferredInit* init = active;
  if (init == nullptr) return;
  at::NoGradGuard no_grad;
  for (auto& param : module.parameters(/*recurse=*/true)) keep(*init, param);
  for (auto& buffer : module.buffers(/*recurse=*/true)) {
    if (buffer.device() != init->options().device) {
      buffer.set_data(buffer.to(init->options().device));
    }
  }
  store().prune();  // the rows of a weight replaced by a tied one
  give_back_freed_memory();
}

void fill_full(at::Tensor& param, const std::function<void(at::Tensor&)>& fill) {
  at::NoGradGuard no_grad;
  DeferredInit* init = active;
  const bool deferred = is_deferred(param);
  if (init != nullptr && init->options().draws == InitDraws::kLocal) {
    fill_local(*init, param, fill, deferred);
    return;
  }
  if (!deferred && param.device().is_cpu()) {
    fill(param);
    return;
  }
  TORCH_CHECK(init != nullptr || !deferred, "ddp: fill_full: the parameter of shape ",
              param.sizes(),
              " holds only this rank's rows of a deferred initialisation that has ended; "
              "initialise it while the DeferredInit is alive");
  // The draws a single process makes come from the CPU generator, whatever the device.
  at::Tensor whole = at::empty(param.sizes(), param.options().device(at::kCPU));
  fill(whole);
  if (deferred || (init != nullptr && init->keeps_rows(param))) {
    keep_rows(*init, param, whole);
    whole = at::Tensor();
    give_back_freed_memory();
    return;
  }
  param.copy_(whole);
}

bool draws_locally() { return active != nullptr && active->options().draws == InitDraws::kLocal; }

at::Tensor unfilled(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::full({1}, std::numeric_limits<double>::quiet_NaN(), options).expand(sizes);
}

bool is_deferred(const at::Tensor& param) { return store().find(param, false).has_value(); }

std::optional<KeptRows> kept_rows(const at::Tensor& param) { return store().find(param, false); }

std::optional<KeptRows> take_kept_rows(const at::Tensor& param) {
  return store().find(param, true);
}

}  // namespace ddp::shard
