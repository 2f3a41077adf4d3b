#include "ddp/shard/shard_plan.hpp"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "ddp/buckets/bucket_table.hpp"
#include "ddp/comm/flat_shards.hpp"

namespace ddp::shard {
namespace {

bool inside(const std::string& name, const std::string& unit) {
  return name.size() > unit.size() && name.compare(0, unit.size(), unit) == 0 &&
         name[unit.size()] == '.';
}

// The unit that claims parameter `p`: the longest unit name u with every name of p starting "u."
// (deepest wins), or `root` when none does.
size_t owner_of(const ParamShape& p, const std::vector<std::string>& unit_names, size_t root) {
  size_t best = root;
  size_t best_length = 0;
  for (size_t u = 0; u < unit_names.size(); ++u) {
    const std::string& unit = unit_names[u];
    bool all = inside(p.name, unit);
    for (const std::string& alias : p.aliases) all = all && inside(alias, unit);
    if (all && (best == root || unit.size() > best_length)) {
      best = u;
      best_length = unit.size();
    }
  }
  return best;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

bool style_shards(const ParamShape& p, int world, DataParallelStyle style) {
  if (style == DataParallelStyle::kReplicate || p.shape.empty() || !p.trainable) return false;
  if (style == DataParallelStyle::kFullyShard) return true;
  return p.shape[0] % world == 0;
}

int64_t ParamShard::rows() const { return layout.shape.empty() ? 1 : layout.shape[0]; }

int64_t ParamShard::row_numel() const {
  int64_t numel = 1;
  for (size_t d = 1; d < layout.shape.size(); ++d) numel *= layout.shape[d];
  return numel;
}

int64_t ParamShard::chunk() const {
  return sharded() ? layout::padded_local_shape(layout)[0] : rows();
}

int64_t ParamShard::rows_on(int rank) const {
  return sharded() ? layout::local_shape(layout, {rank})[0] : rows();
}

int64_t ParamShard::padding_rows() const {
  return sharded() ? chunk() * layout.mesh[0] - rows() : 0;
}

int64_t ShardPlan::local_param_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    bytes += params[i].local_numel() * static_cast<int64_t>(c10::elementSize(shapes[i].dtype));
  }
  return bytes;
}

ShardPlan plan_shards(const std::vector<ParamShape>& params,
                      const std::vector<std::string>& unit_names, int world,
                      DataParallelStyle style) {
  TORCH_CHECK(world >= 1, "ddp: plan_shards: world size ", world, " must be at least 1");
  for (size_t u = 0; u < unit_names.size(); ++u) {
    TORCH_CHECK(!unit_names[u].empty(),
                "ddp: a unit name is empty; the root unit holds what no named unit claims");
    TORCH_CHECK(std::find(unit_names.begin(), unit_names.begin() + static_cast<long>(u),
                          unit_names[u]) == unit_names.begin() + static_cast<long>(u),
                "ddp: unit '", unit_names[u], "' is listed twice");
  }
  ShardPlan plan;
  plan.style = style;
  plan.world = world;
  plan.shapes = params;
  plan.params.resize(params.size());
  const size_t root = unit_names.size();
  std::vector<std::vector<size_t>> members(unit_names.size() + 1);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamShape& p = params[i];
    ParamShard& s = plan.params[i];
    s.layout.shape = p.shape;
    s.layout.mesh = {world};
    if (style_shards(p, world, style))
      s.layout.placements.push_back(layout::Placement::shard(0, 0));
    members[owner_of(p, unit_names, root)].push_back(i);
  }
  for (size_t u = 0; u < unit_names.size(); ++u) {
    TORCH_CHECK(!members[u].empty(), "ddp: unit '", unit_names[u],
                "' holds no parameter: no parameter name starts with '", unit_names[u], ".'");
  }
  // Units in the order of their first parameter; the root (if it holds anything) last.
  std::vector<size_t> order(unit_names.size());
  for (size_t u = 0; u < order.size(); ++u) order[u] = u;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return members[a].front() < members[b].front(); });
  if (!members[root].empty()) order.push_back(root);
  for (size_t u : order) {
    Unit unit;
    unit.name = u == root ? "" : unit_names[u];
    unit.params = members[u];
    for (size_t i : unit.params) {
      plan.params[i].unit = plan.units.size();
      unit.local_numel += plan.params[i].local_numel();
    }
    plan.units.push_back(std::move(unit));
  }
  return plan;
}

std::string format_unit_table(const ShardPlan& plan) {
  std::vector<std::vector<std::string>> rows;
  for (const Unit& unit : plan.units) {
    for (size_t k = 0; k < unit.params.size(); ++k) {
      const size_t i = unit.params[k];
      const ParamShard& s = plan.params[i];
      const int64_t bytes =
          s.local_numel() * static_cast<int64_t>(c10::elementSize(plan.shapes[i].dtype));
      std::string style = s.sharded() ? "shard" : "replicate";
      if (!plan.shapes[i].trainable) style += " (frozen)";
      if (s.padding_rows() > 0) {
        style += " (+" + std::to_string(s.padding_rows()) + " pad rows)";
      }
      rows.push_back({k == 0 ? (unit.name.empty() ? "<root>" : unit.name) : "", plan.shapes[i].name,
                      shape_text(plan.shapes[i].shape), style, std::to_string(bytes)});
    }
  }
  return std::string("Data-parallel units (") + style_name(plan.style) + ", world " +
         std::to_string(plan.world) + ", " + std::to_string(plan.units.size()) + " units)\n" +
         buckets::format_text_table(
             {"Unit", "Param Names", "Shape", "Style", "Shard bytes per rank"}, rows,
             {false, false, false, false, true});
}

}  // namespace ddp::shard
