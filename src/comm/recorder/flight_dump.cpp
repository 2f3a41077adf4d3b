#include "ddp/comm/recorder/flight_dump.hpp"

#include <dirent.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "ddp/comm/recorder/flight_recorder.hpp"

namespace ddp::comm {

namespace {

using json = nlohmann::json;

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

const json& field(const json& j, const char* key, const std::string& path, const std::string& at) {
  if (!j.is_object() || !j.contains(key)) {
    refuse(path, "field '" + at + key + "' is missing");
  }
  return j.at(key);
}

int64_t integer(const json& j, const char* key, const std::string& path, const std::string& at) {
  const json& v = field(j, key, path, at);
  if (!v.is_number_integer()) refuse(path, "field '" + at + key + "' is not an integer");
  return v.get<int64_t>();
}

int small_integer(const json& j, const char* key, const std::string& path, const std::string& at) {
  const int64_t v = integer(j, key, path, at);
  if (v < -1 || v > (int64_t(1) << 30)) {
    refuse(path, "field '" + at + key + "' is " + std::to_string(v) + ", out of range");
  }
  return static_cast<int>(v);
}

std::string text(const json& j, const char* key, const std::string& path, const std::string& at) {
  const json& v = field(j, key, path, at);
  if (!v.is_string()) refuse(path, "field '" + at + key + "' is not a string");
  return v.get<std::string>();
}

const json& array(const json& j, const char* key, const std::string& path, const std::string& at) {
  const json& v = field(j, key, path, at);
  if (!v.is_array()) refuse(path, "field '" + at + key + "' is not an array");
  return v;
}

DumpedCollective read_entry(const json& e, const std::string& path, const std::string& at) {
  DumpedCollective c;
  c.seq = integer(e, "seq", path, at);
  c.kind = text(e, "kind", path, at);
  c.dtype = text(e, "dtype", path, at);
  c.numel = integer(e, "numel", path, at);
  c.root = small_integer(e, "root", path, at);
  c.purpose = text(e, "purpose", path, at);
  c.index = integer(e, "index", path, at);
  c.epoch = integer(e, "epoch", path, at);
  c.step = integer(e, "step", path, at);
  c.issued_us = integer(e, "issued_us", path, at);
  c.ended_us = integer(e, "ended_us", path, at);
  c.state = text(e, "state", path, at);
  // Optional: dumps written before replays were recorded have none.
  if (e.contains("replay")) c.replay = integer(e, "replay", path, at);
  bool known = false;
  for (int s = 0; s <= static_cast<int>(kLastFlightState); ++s) {
    known |= c.state == flight_state_name(static_cast<FlightState>(s));
  }
  if (!known)
    refuse(path, "field '" + at + "state' is '" + c.state + "', not a collective's state");
  return c;
}

DumpedGroup read_group(const json& g, const std::string& path, const std::string& at) {
  DumpedGroup group;
  group.name = text(g, "name", path, at);
  group.mesh_dim = small_integer(g, "mesh_dim", path, at);
  group.rank = small_integer(g, "rank", path, at);
  for (const json& r : array(g, "global_ranks", path, at)) {
    if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() > (1 << 30)) {
      refuse(path, "field '" + at + "global_ranks' holds something not a rank");
    }
    group.global_ranks.push_back(r.get<int>());
  }
  if (group.rank < 0 || group.rank >= static_cast<int>(group.global_ranks.size())) {
    refuse(path, "field '" + at + "rank' is " + std::to_string(group.rank) + ", outside its " +
                     std::to_string(group.global_ranks.size()) + " global ranks");
  }
  group.issued = integer(g, "issued", path, at);
  const json& entries = array(g, "entries", path, at);
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string entry_at = at + "entries[" + std::to_string(i) + "].";
    group.entries.push_back(read_entry(entries[i], path, entry_at));
    const int64_t seq = group.entries.back().seq;
    const int64_t expected = i == 0 ? seq : group.entries[i - 1].seq + 1;
    if (seq != expected || seq < 1 || seq > group.issued) {
      refuse(path, "field '" + entry_at + "seq' is " + std::to_string(seq) + ", expected " +
                       (i == 0 ? "1.." + std::to_string(group.issued) : std::to_string(expected)));
    }
  }
  if (!group.entries.empty() && group.entries.back().seq != group.issued) {
    refuse(path, "field '" + at + "issued' is " + std::to_string(group.issued) +
                     " but the newest entry is #" + std::to_string(group.entries.back().seq));
  }
  return group;
}

}  // namespace

std::string DumpedCollective::describe() const {
  std::string out = kind;
  if (root >= 0) out += " from rank " + std::to_string(root);
  if (numel >= 0) out += " of " + std::to_string(numel) + " " + dtype + " elements";
  CollectivePurpose p;
  for (int candidate = 0; candidate <= static_cast<int>(kLastPurpose); ++candidate) {
    if (purpose == purpose_name(static_cast<Purpose>(candidate))) {
      p.what = static_cast<Purpose>(candidate);
    }
  }
  p.index = index;
  p.epoch = epoch;
  out += " for " + (purpose == purpose_name(p.what) ? p.describe() : purpose);
  if (replay >= 0) out += " (replay of captured step " + std::to_string(replay) + ")";
  return out;
}

std::string DumpedCollective::signature() const {
  return kind + "|" + dtype + "|" + std::to_string(numel) + "|" + std::to_string(root) + "|" +
         purpose + "|" + std::to_string(index) + "|" + std::to_string(epoch);
}

std::string clock_time(int64_t unix_us) {
  const std::time_t seconds = static_cast<std::time_t>(unix_us / 1000000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char out[32];
  std::snprintf(out, sizeof(out), "%02d:%02d:%02d.%03d", utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<int>((unix_us / 1000) % 1000));
  return out;
}

RankDump parse_flight_dump(const std::string& text_in, const std::string& path) {
  json j;
  try {
    j = json::parse(text_in);
  } catch (const json::exception& e) {
    refuse(path, std::string("not a flight recorder dump (not JSON: ") + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("format") || !j.at("format").is_string() ||
      j.at("format").get<std::string>() != "ddp-flight-recorder") {
    refuse(path, "not a flight recorder dump (no \"format\": \"ddp-flight-recorder\")");
  }
  const int64_t version = integer(j, "version", path, "");
  if (version != kFlightDumpVersion) {
    refuse(path, "a dump of version " + std::to_string(version) + "; this tool reads version " +
                     std::to_string(kFlightDumpVersion));
  }
  RankDump d;
  d.path = path;
  d.rank = small_integer(j, "rank", path, "");
  d.world_size = small_integer(j, "world_size", path, "");
  if (d.rank < 0 || d.rank >= d.world_size) {
    refuse(path, "rank " + std::to_string(d.rank) + " is outside world size " +
                     std::to_string(d.world_size));
  }
  d.reason = text(j, "reason", path, "");
  d.dumped_us = integer(j, "dumped_us", path, "");
  // Optional: dumps written before SIGCONT was recorded have none.
  if (j.contains("continued_us")) d.continued_us = integer(j, "continued_us", path, "");
  // A named prefix, not a temporary: the reference returned points into `j`, but GCC 13+ warns
  // (-Wdangling-reference) on a reference returned from a call that took a temporary.
  const std::string top;
  const json& groups = array(j, "groups", path, top);
  for (size_t i = 0; i < groups.size(); ++i) {
    d.groups.push_back(read_group(groups[i], path, "groups[" + std::to_string(i) + "]."));
    const DumpedGroup& g = d.groups.back();
    if (g.global_ranks[static_cast<size_t>(g.rank)] != d.rank) {
      refuse(path, "group '" + g.name + "' says this is global rank " +
                       std::to_string(g.global_ranks[static_cast<size_t>(g.rank)]) +
                       ", the dump says " + std::to_string(d.rank));
    }
  }
  return d;
}

RankDump read_flight_dump(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) refuse(path, "cannot be read");
  std::stringstream text_in;
  text_in << in.rdbuf();
  return parse_flight_dump(text_in.str(), path);
}

std::vector<RankDump> read_flight_dumps(const std::string& dir) {
  DIR* handle = ::opendir(dir.c_str());
  if (handle == nullptr) refuse(dir, "is not a directory that can be read");
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(handle)) {
    const std::string name = e->d_name;
    if (name.rfind("flight-rank", 0) == 0 && name.size() > 16 &&
        name.compare(name.size() - 5, 5, ".json") == 0) {
      names.push_back(name);
    }
  }
  ::closedir(handle);
  if (names.empty()) refuse(dir, "holds no flight recorder dump (flight-rank<R>.json)");
  std::sort(names.begin(), names.end());
  std::vector<RankDump> dumps;
  for (const std::string& name : names) dumps.push_back(read_flight_dump(dir + "/" + name));
  std::sort(dumps.begin(), dumps.end(),
            [](const RankDump& a, const RankDump& b) { return a.rank < b.rank; });
  for (size_t i = 1; i < dumps.size(); ++i) {
    if (dumps[i].rank == dumps[i - 1].rank) {
      refuse(dumps[i].path, "a second dump of rank " + std::to_string(dumps[i].rank) + " (also " +
                                dumps[i - 1].path + ")");
    }
    if (dumps[i].world_size != dumps[0].world_size) {
      refuse(dumps[i].path, "world size " + std::to_string(dumps[i].world_size) + ", but " +
                                dumps[0].path + " says " + std::to_string(dumps[0].world_size));
    }
  }
  return dumps;
}

}  // namespace ddp::comm
