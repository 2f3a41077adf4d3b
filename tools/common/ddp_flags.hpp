#pragma once
// The flags every tool that wraps a model in DistributedDataParallel shares, derived from the one
// options model (parallel/ddp_options.hpp): ddp-train and ddp-bench register them here, so a flag
// has one name, one meaning and one default everywhere, and adding an option adds its flag once.

#include <CLI/CLI.hpp>

#include <string>

#include "ddp/comm/process_group.hpp"
#include "ddp/hooks/comm_hook.hpp"
#include "ddp/parallel/ddp_options.hpp"

namespace ddp::tools {

// --bucket-cap-mb, --first-bucket-cap-mb, --no-bucket-view, --find-unused-parameters,
// --static-graph, --no-graph-planning, --stats-every; each writes into `options`, whose current
// values are the shown defaults.
void add_ddp_flags(CLI::App& app, parallel::DDPOptions& options);

// The comm hooks a tool can name: allreduce (the built-in average), fp16, bf16, powersgd.
const std::vector<std::string>& comm_hook_names();
// --comm-hook NAME (default allreduce).
void add_comm_hook_flag(CLI::App& app, std::string& name);
// The hook for `name` over `pg`; null for "allreduce" (the built-in average). Unknown names are an
// error that lists the known ones.
hooks::CommHookPtr make_comm_hook(const std::string& name, comm::ProcessGroupPtr pg);

}  // namespace ddp::tools
