#include "ddp/parallel/ddp_options.hpp"

namespace ddp::parallel {

std::vector<std::pair<std::string, std::string>> describe(const DDPOptions& options) {
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  std::string ignored;
  for (const auto& name : options.params_to_ignore) ignored += (ignored.empty() ? "" : ",") + name;
  std::vector<std::pair<std::string, std::string>> out;
  out.emplace_back("broadcast_buffers", flag(options.broadcast_buffers));
  out.emplace_back("graph_planning", flag(options.graph_planning));
  out.emplace_back("params_to_ignore", "[" + ignored + "]");
  out.emplace_back("stats_every", std::to_string(options.stats_every));
  out.emplace_back("check_replicas_every", std::to_string(options.check_replicas_every));
  out.emplace_back("verbose", flag(options.verbose));
  gradients::describe(options.gradients, "gradients.", out);
  return out;
}

}  // namespace ddp::parallel
