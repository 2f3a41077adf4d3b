// ddp-forensics DIR: reads every rank's flight recorder dump in DIR (--flight-recorder DIR, or
// DDP_FLIGHT_RECORDER_DIR), lines the ranks up by group and sequence number, and says first, in
// one sentence, where they diverged: a rank that never issued a collective the others issued, ranks
// that issued different collectives at one number, a rank stuck outside collectives, a rank that
// left no dump. Then the last entries of every rank. --json: the same for programs.
//
// Exit codes: 0 the dumps were read (whatever they say), 2 a bad flag, 1 a damaged, foreign or
// missing dump (named).

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/flag_parse.hpp"
#include "ddp/comm/recorder/flight_divergence.hpp"

namespace {

using ddp::comm::DumpedCollective;
using ddp::comm::RankDump;

constexpr int kLastEntries = 3;  // per rank and group in the table: the moments before it stopped

std::string state_time(const DumpedCollective& e) {
  if (e.state == "issued") return "issued " + ddp::comm::clock_time(e.issued_us);
  return e.state + " " + ddp::comm::clock_time(e.ended_us);
}

void print_table(const std::vector<RankDump>& dumps) {
  std::cout << "\nlast collectives of each rank (newest last):\n";
  for (const RankDump& d : dumps) {
    for (const auto& g : d.groups) {
      std::cout << "rank " << d.rank << ", group " << g.name << " (" << g.issued << " issued):\n";
      const size_t from = g.entries.size() > kLastEntries ? g.entries.size() - kLastEntries : 0;
      for (size_t i = from; i < g.entries.size(); ++i) {
        const DumpedCollective& e = g.entries[i];
        std::cout << "  #" << std::left << std::setw(8) << e.seq << " step " << std::setw(6)
                  << e.step << std::setw(24) << state_time(e) << " " << e.describe() << "\n";
      }
    }
    // The reason's first line: a failed wait's reason carries torch's backtrace after it, kept in
    // the dump (and in --json) for whoever needs it, not on this screen.
    const size_t line_end = d.reason.find('\n');
    std::cout << "rank " << d.rank << " dumped because: " << d.reason.substr(0, line_end);
    if (line_end != std::string::npos) {
      const auto lines = std::count(d.reason.begin(), d.reason.end(), '\n');
      std::cout << " (" << lines << (lines == 1 ? " more line in " : " more lines in ") << d.path
                << ")";
    }
    std::cout << "\n";
  }
}

nlohmann::json as_json(const ddp::comm::Divergence& d, const std::vector<RankDump>& dumps) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankDump& r : dumps) {
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : r.groups) {
      nlohmann::json last = nullptr;
      if (!g.entries.empty()) {
        const DumpedCollective& e = g.entries.back();
        last = {{"seq", e.seq},   {"kind", e.kind},   {"purpose", e.purpose},    {"index", e.index},
                {"step", e.step}, {"state", e.state}, {"describe", e.describe()}};
      }
      groups.push_back({{"name", g.name}, {"issued", g.issued}, {"last", last}});
    }
    ranks.push_back({{"rank", r.rank}, {"reason", r.reason}, {"groups", groups}});
  }
  return {{"kind", d.kind}, {"sentence", d.sentence},    {"group", d.group},
          {"seq", d.seq},   {"ranks_at_fault", d.ranks}, {"ranks", ranks}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ddp-forensics: names the first divergence of a hung or failed job from its "
      "flight recorder dumps"};
  std::string dir;
  bool json = false;
  app.add_option("dir", dir, "the directory of flight-rank<R>.json dumps (--flight-recorder DIR)")
      ->required();
  app.add_flag("--json", json, "print the analysis as one JSON object");
  if (const int code = ddp::tools::parse_flags(app, argc, argv, "ddp-forensics"); code >= 0) {
    return code;
  }
  try {
    const std::vector<RankDump> dumps = ddp::comm::read_flight_dumps(dir);
    const ddp::comm::Divergence d = ddp::comm::first_divergence(dumps, dumps[0].world_size);
    if (json) {
      std::cout << as_json(d, dumps).dump() << std::endl;
      return 0;
    }
    std::cout << d.sentence << "\n";
    print_table(dumps);
    std::cout.flush();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddp-forensics: " << e.what() << std::endl;
    return 1;
  }
}
