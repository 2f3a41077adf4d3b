#include "ddp/shard/shard_options.hpp"

#include <sstream>

namespace ddp::shard {

void describe(const ShardOptions& options, const std::string& prefix,
              std::vector<std::pair<std::string, std::string>>& out) {
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  auto dtype = [](const std::optional<c10::ScalarType>& t) {
    if (!t) return std::string("none");
    std::ostringstream text;
    text << *t;
    return text.str();
  };
  std::string units;
  for (const auto& name : options.units) units += (units.empty() ? "" : ",") + name;
  out.emplace_back(prefix + "style", style_name(options.style));
  out.emplace_back(prefix + "units", "[" + units + "]");
  out.emplace_back(prefix + "reshard_after_forward", flag(options.reshard_after_forward));
  out.emplace_back(prefix + "prefetch", flag(options.prefetch));
  out.emplace_back(prefix + "param_dtype", dtype(options.param_dtype));
  out.emplace_back(prefix + "reduce_dtype", dtype(options.reduce_dtype));
  out.emplace_back(prefix + "broadcast_buffers", flag(options.broadcast_buffers));
  out.emplace_back(prefix + "stats_every", std::to_string(options.stats_every));
  out.emplace_back(prefix + "verbose", flag(options.verbose));
  gradients::describe(options.replicated, prefix + "replicated.", out);
}

}  // namespace ddp::shard
