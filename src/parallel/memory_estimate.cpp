#include "ddp/parallel/memory_estimate.hpp"

#include <algorithm>
#include <cstdio>

namespace ddp::parallel {
namespace {

int64_t numel_of(const shard::ParamShape& p) {
  int64_t n = 1;
  for (const int64_t d : p.shape) n *= d;
  return n;
}

int64_t bytes_of(const shard::ParamShape& p) {
  return numel_of(p) * static_cast<int64_t>(c10::elementSize(p.dtype));
}

std::string gb(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GB", static_cast<double>(bytes) / 1e9);
  return text;
}

// A unit's gathered elements: its sharded parameters, padded (world * chunk rows each).
int64_t gathered_numel(const shard::ShardPlan& plan, const shard::Unit& unit) {
  int64_t n = 0;
  for (const size_t i : unit.params) {
    const shard::ParamShard& s = plan.params[i];
    if (s.sharded()) n += plan.world * s.local_numel();
  }
  return n;
}

StyleEstimate sharded(const MemoryInputs& in, shard::DataParallelStyle style) {
  const shard::ShardPlan plan = shard::plan_shards(in.params, in.units, in.world, style);
  StyleEstimate e;
  e.style = style;
  for (size_t i = 0; i < plan.shapes.size(); ++i) {
    const shard::ParamShard& s = plan.params[i];
    const int64_t element = static_cast<int64_t>(c10::elementSize(plan.shapes[i].dtype));
    const int64_t here = s.sharded() ? s.local_numel() * element : bytes_of(plan.shapes[i]);
    e.params += here;
    if (plan.shapes[i].trainable) e.grads += here;
  }
  const c10::ScalarType own = in.params.empty() ? c10::kFloat : in.params[0].dtype;
  const int64_t gather = static_cast<int64_t>(c10::elementSize(in.param_dtype.value_or(own)));
  const int64_t reduce = static_cast<int64_t>(
      c10::elementSize(in.reduce_dtype ? *in.reduce_dtype : in.param_dtype.value_or(own)));
  int64_t root = 0, largest = 0;
  for (const shard::Unit& unit : plan.units) {
    const int64_t n = gathered_numel(plan, unit);
    if (unit.name.empty()) {
      root = n;
    } else {
      largest = std::max(largest, n);
    }
  }
  const int64_t gathered_units = (in.prefetch ? 2 : 1) * largest * gather;
  const int64_t forward = root * gather + gathered_units;
  const int64_t backward = forward + largest * (gather + reduce);
  const int64_t end_of_backward = root * (2 * gather + reduce);
  e.gathered = std::max({forward, backward, end_of_backward});
  return e;
}

// "parameters 8.03 GB, gradients ...; activations ~9.50 GB": format_estimate's and the refusal's.
std::string parts(const StyleEstimate& e) {
  return "parameters " + gb(e.params) + ", gradients " + gb(e.grads) + ", optimizer state " +
         gb(e.optimizer_state) + ", gathered " + gb(e.gathered) + "; activations " +
         (e.activations > 0 ? "~" + gb(e.activations) : std::string("not estimated"));
}

}  // namespace

std::vector<StyleEstimate> estimate_memory(const MemoryInputs& in) {
  StyleEstimate replicate;
  for (const shard::ParamShape& p : in.params) {
    replicate.params += bytes_of(p);
    if (p.trainable) replicate.grads += bytes_of(p);
  }
  std::vector<StyleEstimate> out{replicate, sharded(in, shard::DataParallelStyle::kFullyShard),
                                 sharded(in, shard::DataParallelStyle::kDefault)};
  for (StyleEstimate& e : out) {
    // The state follows the gradients: a frozen parameter has neither.
    e.optimizer_state =
        static_cast<int64_t>(in.optimizer_state_per_param_byte * static_cast<double>(e.grads));
    e.activations = in.activation_bytes;
  }
  return out;
}

std::string format_estimate(const StyleEstimate& e) {
  return std::string(shard::style_name(e.style)) + ": " + parts(e);
}

std::string memory_refusal(const std::vector<StyleEstimate>& estimates,
                           shard::DataParallelStyle chosen, int64_t capacity, int world) {
  const auto it = std::find_if(estimates.begin(), estimates.end(),
                               [&](const StyleEstimate& e) { return e.style == chosen; });
  if (it == estimates.end() || it->held() <= capacity) return "";
  const std::string text = std::string("ddp: style ") + shard::style_name(chosen) +
                           " needs an estimated " + gb(it->held()) +
                           " a rank before activations (" + parts(*it) + ") but the device holds " +
                           gb(capacity);
  const StyleEstimate* fits = nullptr;
  for (const StyleEstimate& e : estimates) {
    if (e.held() <= capacity && (fits == nullptr || e.held() < fits->held())) fits = &e;
  }
  if (fits != nullptr) {
    return text + "; style " + shard::style_name(fits->style) + " fits: " + gb(fits->held()) +
           " a rank";
  }
  return text + "; no style fits at world " + std::to_string(world) + ": use more ranks";
}

}  // namespace ddp::parallel
