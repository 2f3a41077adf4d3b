#include "ddp/comm/recorder/flight_divergence.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::comm {

namespace {

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

std::string ranks_word(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + join_ranks(ranks);
}

// One group as every rank dumped it: the global rank of each dump holding it.
struct GroupView {
  std::string name;
  std::map<int, const DumpedGroup*> by_rank;  // global rank -> its dump of the group
};

const DumpedCollective* entry_at(const DumpedGroup& g, int64_t seq) {
  if (g.entries.empty() || seq < g.entries.front().seq || seq > g.entries.back().seq) {
    return nullptr;
  }
  return &g.entries[static_cast<size_t>(seq - g.entries.front().seq)];
}

// Completed, or captured into a CUDA graph (it runs in the replays, recorded on their own): not
// where a rank waits.
bool ended_well(const DumpedCollective& e) {
  return e.state == "completed" || e.state == "captured";
}

// A rank whose last collective ended less than this before its dump was still running: 1 s, a
// hundred steps of a fast model, far below any collective timeout.
constexpr int64_t kRunningUs = 1000000;

}  // namespace

namespace {

using Groups = std::map<std::string, GroupView>;

// Sets of ranks, the largest first (a tie: the set holding the lowest rank first): the ranks
// that agree with most are the reference, the odd ones out are named.
template <typename Key>
std::vector<std::pair<Key, std::vector<int>>> largest_first(
    const std::map<Key, std::vector<int>>& by) {
  std::vector<std::pair<Key, std::vector<int>>> sets(by.begin(), by.end());
  std::sort(sets.begin(), sets.end(), [](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() > b.second.size();
    return a.second.front() < b.second.front();
  });
  return sets;
}

std::string steps_word(int64_t n) { return n == 1 ? "one step" : std::to_string(n) + " steps"; }

// At one sequence number: ranks that issued different collectives, or the same one in different
// steps. nullopt when they agree.
std::optional<Divergence> differs_at(const std::string& name, const GroupView& view, int64_t seq) {
  std::map<std::string, std::vector<int>> by_signature;
  std::map<std::string, const DumpedCollective*> example;
  std::map<int64_t, std::vector<int>> by_step;  // ranks that know their step
  for (const auto& [rank, g] : view.by_rank) {
    const DumpedCollective* e = entry_at(*g, seq);
    if (e == nullptr) continue;  // overwritten in that rank's ring
    by_signature[e->signature()].push_back(rank);
    example[e->signature()] = e;
    if (e->step >= 0) by_step[e->step].push_back(rank);
  }
  Divergence d;
  d.group = name;
  d.seq = seq;
  const std::string where = "collective #" + std::to_string(seq) + " of group " + name;
  if (by_step.size() > 1) {
    // A skipped step shifts every later collective of that rank by one step: named by its step
    // tags where it starts, whether or not the collectives themselves differ.
    const auto sets = largest_first(by_step);
    d.kind = "steps";
    for (size_t i = 1; i < sets.size(); ++i) {
      const int64_t delta = sets[i].first - sets[0].first;
      d.sentence += (i == 1 ? "" : "; ") + ranks_word(sets[i].second) + " ran step " +
                    std::to_string(sets[i].first) + "'s collectives " +
                    steps_word(delta < 0 ? -delta : delta) + (delta > 0 ? " early" : " late");
      d.ranks.insert(d.ranks.end(), sets[i].second.begin(), sets[i].second.end());
    }
    d.sentence += " from " + where + " (" + ranks_word(sets[0].second) + " ran step " +
                  std::to_string(sets[0].first) + "'s there)";
    return d;
  }
  if (by_signature.size() <= 1) return std::nullopt;
  const auto sets = largest_first(by_signature);
  d.kind = "mismatch";
  d.sentence = where + " differs: ";
  for (size_t i = 0; i < sets.size(); ++i) {
    // A rank the collective check stopped never issued it (its state says so).
    const bool refused = example[sets[i].first]->state == "refused";
    const char* verb = !refused ? " issued "
                       : sets[i].second.size() == 1
                           ? " was stopped by the collective check before issuing "
                           : " were stopped by the collective check before issuing ";
    d.sentence += (i == 0 ? "" : "; ") + ranks_word(sets[i].second) + verb +
                  example[sets[i].first]->describe();
    if (i > 0) d.ranks.insert(d.ranks.end(), sets[i].second.begin(), sets[i].second.end());
  }
  return d;
}

// 1. Different collectives (or steps) at one number: the earliest issued across groups.
std::optional<Divergence> find_mismatch(const Groups& groups) {
  std::optional<Divergence> first;
  int64_t first_at = 0;
  for (const auto& [name, view] : groups) {
    int64_t common = INT64_MAX;
    for (const auto& [rank, g] : view.by_rank) common = std::min(common, g->issued);
    for (int64_t seq = 1; seq <= common; ++seq) {
      std::optional<Divergence> d = differs_at(name, view, seq);
      if (!d) continue;
      int64_t issued = INT64_MAX;
      for (const auto& [rank, g] : view.by_rank) {
        if (const DumpedCollective* e = entry_at(*g, seq)) issued = std::min(issued, e->issued_us);
      }
      if (!first || issued < first_at) {
        first = d;
        first_at = issued;
      }
      break;
    }
  }
  return first;
}

bool broke(const DumpedCollective& e) { return e.state == "timed out" || e.state == "failed"; }

// Where the job broke: the collective that failed or timed out first on any rank (with
// `timed_out_only`, the first that timed out), the ranks in `besides` left out.
struct Break {
  std::string group;
  int64_t seq = 0;
  const DumpedCollective* entry = nullptr;  // the earliest broken one
  std::vector<int> ranks;                   // every rank whose entry at seq broke
};

std::optional<Break> find_break(const Groups& groups, bool timed_out_only,
                                const std::vector<int>& besides = {}) {
  const auto left_out = [&](int rank) {
    return std::find(besides.begin(), besides.end(), rank) != besides.end();
  };
  std::optional<Break> first;
  for (const auto& [name, view] : groups) {
    for (const auto& [rank, g] : view.by_rank) {
      if (left_out(rank)) continue;
      for (const DumpedCollective& e : g->entries) {
        if (!(timed_out_only ? e.state == "timed out" : broke(e))) continue;
        if (!first || e.ended_us < first->entry->ended_us) first = Break{name, e.seq, &e, {}};
        break;
      }
    }
  }
  if (!first) return first;
  for (const auto& [rank, g] : groups.at(first->group).by_rank) {
    if (left_out(rank)) continue;
    const DumpedCollective* e = entry_at(*g, first->seq);
    if (e != nullptr && broke(*e)) first->ranks.push_back(rank);
  }
  return first;
}

// "rank 0 had timed out in it at 12:01:05.100", "ranks 0 and 1 had failed in it from ...".
std::string broke_in_it(const Break& b) {
  return ranks_word(b.ranks) + " had " + b.entry->state + " in it " +
         (b.ranks.size() == 1 ? "at " : "from ") + clock_time(b.entry->ended_us);
}

// A rank's entry at the break, when it issued it before the break and had not completed it then.
const DumpedCollective* inside_at_break(const GroupView& view, int rank, const Break& b) {
  const auto it = view.by_rank.find(rank);
  if (it == view.by_rank.end()) return nullptr;
  const DumpedCollective* e = entry_at(*it->second, b.seq);
  if (e == nullptr || e->issued_us > b.entry->ended_us) return nullptr;
  if (ended_well(*e) && e->ended_us <= b.entry->ended_us) return nullptr;
  return e;
}

// 2. A rank stopped (SIGSTOP, a debugger) until after another had failed waiting: the stop is
// the cause, whatever the rank did once continued (it may have issued or even completed more).
std::optional<Divergence> find_stopped(const Groups& groups, const std::vector<RankDump>& dumps) {
  // Stopped: continued after another rank had broken. Once continued, a stopped rank's own wait
  // may time out at once (its deadline passed while it was stopped): that is not where it broke.
  std::vector<const RankDump*> stopped;
  std::vector<int> stopped_ranks;
  for (const RankDump& d : dumps) {
    if (d.continued_us <= 0) continue;
    const std::optional<Break> other = find_break(groups, /*timed_out_only=*/false, {d.rank});
    if (other && d.continued_us > other->entry->ended_us) {
      stopped.push_back(&d);
      stopped_ranks.push_back(d.rank);
    }
  }
  if (stopped.empty()) return std::nullopt;
  const std::optional<Break> b = find_break(groups, /*timed_out_only=*/false, stopped_ranks);
  if (!b) return std::nullopt;  // every rank that broke was itself stopped
  const RankDump& r = *stopped.front();
  const GroupView& view = groups.at(b->group);
  Divergence d;
  d.kind = "stopped";
  d.group = b->group;
  d.seq = b->seq;
  for (const RankDump* s : stopped) d.ranks.push_back(s->rank);
  const std::string rank = "rank " + std::to_string(r.rank);
  const std::string where = "collective #" + std::to_string(b->seq) + " of group " + b->group +
                            " (" + b->entry->describe() + ")";
  const std::string continued = "continued at " + clock_time(r.continued_us);
  if (const DumpedCollective* e = inside_at_break(view, r.rank, *b)) {
    d.sentence = rank + " issued " + where + " at " + clock_time(e->issued_us) +
                 " and never completed it: it was stopped inside it (" + continued + ", after " +
                 broke_in_it(*b) + ")";
  } else {
    d.sentence = rank + " never issued " + where + " before " + broke_in_it(*b) +
                 ": it was stopped before it (" + continued + ")";
    const auto it = view.by_rank.find(r.rank);
    const DumpedCollective* last =
        it == view.by_rank.end() ? nullptr : entry_at(*it->second, b->seq - 1);
    if (last != nullptr && ended_well(*last)) {
      d.sentence += "; its collective #" + std::to_string(last->seq) + " " + last->state + " at " +
                    clock_time(last->ended_us);
    }
  }
  if (stopped.size() > 1) {
    std::vector<int> also(d.ranks.begin() + 1, d.ranks.end());
    d.sentence += "; " + ranks_word(also) + (also.size() == 1 ? " was" : " were") + " stopped too";
  }
  return d;
}

// 3. A rank that never issued what others issued: the lowest count of any group.
std::optional<Divergence> find_missing(const Groups& groups,
                                       const std::map<int, int64_t>& dumped_at,
                                       const std::map<int, int64_t>& continued_at) {
  std::optional<Divergence> missing;
  int64_t missing_count = INT64_MAX;
  for (const auto& [name, view] : groups) {
    int64_t most = 0;
    for (const auto& [rank, g] : view.by_rank) most = std::max(most, g->issued);
    for (const auto& [rank, g] : view.by_rank) {
      if (g->issued >= most || g->issued >= missing_count) continue;
      const int64_t seq = g->issued + 1;
      std::vector<int> ahead;
      const DumpedCollective* next = nullptr;
      for (const auto& [other, og] : view.by_rank) {
        if (og->issued < seq) continue;
        ahead.push_back(other);
        const DumpedCollective* e = entry_at(*og, seq);
        if (e != nullptr && (next == nullptr || e->issued_us < next->issued_us)) next = e;
      }
      Divergence d;
      d.kind = "missing";
      d.group = name;
      d.seq = seq;
      d.ranks = {rank};
      d.sentence = "rank " + std::to_string(rank) + " never issued collective #" +
                   std::to_string(seq) + " of group " + name;
      if (next != nullptr) d.sentence += " (" + next->describe() + ")";
      d.sentence += ", which " + ranks_word(ahead) + " issued";
      if (next != nullptr) d.sentence += " from " + clock_time(next->issued_us);
      const DumpedCollective* last = g->entries.empty() ? nullptr : &g->entries.back();
      if (last == nullptr) {
        d.sentence += "; rank " + std::to_string(rank) + " issued none in this group";
      } else {
        bool all_completed = true;
        for (const DumpedCollective& e : g->entries) all_completed &= ended_well(e);
        d.sentence += "; rank " + std::to_string(rank) + "'s last collective #" +
                      std::to_string(last->seq) + " " +
                      (last->state == "issued" ? "was issued" : last->state) + " at " +
                      clock_time(last->state == "issued" ? last->issued_us : last->ended_us);
        // Stuck only when nothing happened for a while before its dump; a dump of a running
        // job (SIGTERM, SIGUSR1) catches the ranks a collective or two apart.
        const int64_t idle_us = dumped_at.at(rank) - std::max(last->issued_us, last->ended_us);
        const int64_t continued = continued_at.count(rank) ? continued_at.at(rank) : 0;
        if (all_completed && continued > std::max(last->issued_us, last->ended_us)) {
          // No rank broke in a recorded wait (under NCCL the watchdog ends the process), but
          // the launcher continued this one: it was stopped, not stuck.
          d.sentence += " (every collective it issued completed: it was stopped, continued at " +
                        clock_time(continued) + ")";
        } else if (all_completed && idle_us >= kRunningUs) {
          d.sentence += " (every collective it issued completed: it is stuck outside collectives)";
        } else if (all_completed) {
          d.sentence += " (" + std::to_string(idle_us / 1000) +
                        " ms before its dump: it was running, not stuck)";
        }
      }
      missing = d;
      missing_count = g->issued;
    }
  }
  return missing;
}

// 4. Without a stop on record: a rank that issued the collective another timed out in and still
// had not completed it at its dump, longer after its issue than the other's timeout. A rank
// running normally would have timed out in it too; this one was stopped or stuck inside it.
std::optional<Divergence> find_stuck(const Groups& groups,
                                     const std::map<int, int64_t>& dumped_at) {
  const std::optional<Break> b = find_break(groups, /*timed_out_only=*/true);
  if (!b) return std::nullopt;
  const int64_t timeout_us = b->entry->ended_us - b->entry->issued_us;
  const GroupView& view = groups.at(b->group);
  Divergence d;
  d.kind = "stuck";
  d.group = b->group;
  d.seq = b->seq;
  const DumpedCollective* first = nullptr;
  for (const auto& [rank, g] : view.by_rank) {
    const DumpedCollective* e = entry_at(*g, b->seq);
    if (e == nullptr || e->state != "issued" || e->issued_us > b->entry->ended_us) continue;
    if (dumped_at.at(rank) - e->issued_us < timeout_us) continue;  // still within its timeout
    d.ranks.push_back(rank);
    if (first == nullptr) first = e;
  }
  if (first == nullptr) return std::nullopt;
  d.sentence = ranks_word(d.ranks) + " issued collective #" + std::to_string(b->seq) +
               " of group " + b->group + " (" + first->describe() + ") from " +
               clock_time(first->issued_us) +
               " and never completed it: stopped or stuck inside it (" + broke_in_it(*b) + ")";
  return d;
}

// 5. Ranks without a dump.
std::optional<Divergence> find_absent(const Groups& groups, const std::vector<RankDump>& dumps,
                                      int world_size) {
  std::vector<int> absent;
  for (int r = 0; r < world_size; ++r) {
    if (std::none_of(dumps.begin(), dumps.end(), [&](const RankDump& d) { return d.rank == r; })) {
      absent.push_back(r);
    }
  }
  if (absent.empty()) return std::nullopt;
  Divergence d;
  d.kind = "no dump";
  d.ranks = absent;
  d.sentence = ranks_word(absent) + " left no dump (killed, or never started) and the others " +
               "agree on every collective they hold";
  // Where the others are: the oldest collective not completed (waiting, failed or timed out),
  // when it is the same one on the dumped ranks that have one. Their states may differ (one timed
  // out, a slower one still waited when the launcher ended it): each is said then.
  const DumpedCollective* waiting = nullptr;
  std::string waiting_group;
  std::vector<int> waiters;
  std::map<std::string, std::vector<int>> by_state;
  std::vector<std::string> states;  // in the order first met
  for (const auto& [name, view] : groups) {
    for (const auto& [rank, g] : view.by_rank) {
      for (const DumpedCollective& e : g->entries) {
        if (ended_well(e)) continue;
        if (waiting == nullptr || (name == waiting_group && e.seq == waiting->seq)) {
          if (waiting == nullptr) waiting_group = name;
          waiting = &e;
          waiters.push_back(rank);
          if (by_state[e.state].empty()) states.push_back(e.state);
          by_state[e.state].push_back(rank);
        }
        break;
      }
    }
  }
  if (waiting != nullptr) {
    d.group = waiting_group;
    d.seq = waiting->seq;
    const std::string where = "collective #" + std::to_string(waiting->seq) + " of group " +
                              waiting_group + " (" + waiting->describe() + ", step " +
                              std::to_string(waiting->step) + ", issued at " +
                              clock_time(waiting->issued_us);
    if (states.size() == 1) {
      d.sentence += "; " + ranks_word(waiters) + " " +
                    (waiting->state == "issued" ? "wait in " : "ended in ") + where +
                    (waiting->state == "issued" ? "" : ", " + waiting->state) + ")";
    } else {
      std::string each;
      for (const std::string& state : states) {
        each += (each.empty() ? "" : ", ") + ranks_word(by_state[state]) + " " +
                (state == "issued" ? "still waiting" : state);
      }
      d.sentence += "; " + ranks_word(waiters) + " are in " + where + "): " + each;
    }
  }
  return d;
}

}  // namespace

Divergence first_divergence(const std::vector<RankDump>& dumps, int world_size) {
  Groups groups;
  std::map<int, int64_t> dumped_at;     // by rank
  std::map<int, int64_t> continued_at;  // by rank
  for (const RankDump& d : dumps) {
    dumped_at[d.rank] = d.dumped_us;
    continued_at[d.rank] = d.continued_us;
    for (const DumpedGroup& g : d.groups) {
      groups[g.name].name = g.name;
      groups[g.name].by_rank[d.rank] = &g;
    }
  }
  if (auto d = find_mismatch(groups)) return *d;
  if (auto d = find_stopped(groups, dumps)) return *d;
  if (auto d = find_missing(groups, dumped_at, continued_at)) return *d;
  if (auto d = find_stuck(groups, dumped_at)) return *d;
  if (auto d = find_absent(groups, dumps, world_size)) return *d;
  if (const std::optional<Break> b = find_break(groups, /*timed_out_only=*/false)) {
    // Nothing names a rank: say where the job broke rather than that nothing diverged.
    Divergence d;
    d.kind = "broke";
    d.group = b->group;
    d.seq = b->seq;
    d.ranks = b->ranks;
    d.sentence = "every rank issued the same collectives, but " + ranks_word(b->ranks) + " " +
                 b->entry->state + " in collective #" + std::to_string(b->seq) + " of group " +
                 b->group + " (" + b->entry->describe() + ") " +
                 (b->ranks.size() == 1 ? "at " : "from ") + clock_time(b->entry->ended_us) +
                 " and no rank is known to have been stopped or stuck in it";
    return d;
  }
  Divergence d;
  d.kind = "none";
  d.sentence = "no divergence: every rank issued the same collectives in every group";
  return d;
}

}  // namespace ddp::comm
