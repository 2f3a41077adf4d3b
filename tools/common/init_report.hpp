#pragma once
// What each rank spent getting its wrapped model ready (issue 60): the wall seconds from the
// worker's start (process group, model, wrapping, parameters loaded) and the process's resident
// high-water mark at that point (getrusage's ru_maxrss: the largest the process has been, host
// memory). Printed by the tools' JSON as "init_s" and "init_peak_bytes", one value a rank, so a
// large model's initialisation can be bounded (today every rank builds the whole model first).

#include <chrono>
#include <cstdint>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp::tools {

struct InitReport {
  std::vector<double> seconds;      // by rank
  std::vector<int64_t> peak_bytes;  // by rank
};

// This process's resident high-water mark so far, in bytes.
int64_t resident_peak_bytes();

// Every rank's report (a collective over `world`; null: this process's alone). `start`: the
// worker's start.
InitReport gather_init_report(const comm::ProcessGroupPtr& world,
                              std::chrono::steady_clock::time_point start);

}  // namespace ddp::tools
