#include "ddp/gradients/gradient_options.hpp"

namespace ddp::gradients {

void describe(const GradientOptions& options, const std::string& prefix,
              std::vector<std::pair<std::string, std::string>>& out) {
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  out.emplace_back(prefix + "gradient_as_bucket_view", flag(options.gradient_as_bucket_view));
  out.emplace_back(prefix + "reduce_in_place",
                   options.reduce_in_place ? flag(*options.reduce_in_place) : "auto");
  out.emplace_back(prefix + "find_unused_parameters", flag(options.find_unused_parameters));
  out.emplace_back(prefix + "static_graph", flag(options.static_graph));
  out.emplace_back(prefix + "overlap", flag(options.overlap));
  buckets::describe(options.buckets, prefix + "buckets.", out);
}

}  // namespace ddp::gradients
