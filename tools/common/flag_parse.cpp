#include "common/flag_parse.hpp"

#include <algorithm>
#include <iostream>

namespace ddp::tools {
namespace {

// Levenshtein distance: insertions, deletions and substitutions of one character each.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string nearest_flag(const std::string& given, const std::vector<std::string>& known) {
  constexpr size_t kMaxEdits = 2;
  std::string best;
  size_t best_distance = kMaxEdits + 1;
  for (const std::string& flag : known) {
    const size_t d = edit_distance(given, flag);
    if (d < best_distance) {
      best = flag;
      best_distance = d;
    }
  }
  return best;
}

int parse_flags(CLI::App& app, int argc, char** argv, const std::string& tool,
                const std::string& bare_words) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ExtrasError&) {
    std::vector<std::string> known;
    for (const CLI::Option* option : app.get_options()) {
      for (const std::string& name : option->get_lnames()) known.push_back("--" + name);
    }
    for (const std::string& extra : app.remaining()) {
      if (extra.rfind("--", 0) != 0) continue;
      const std::string given = extra.substr(0, extra.find('='));
      const std::string near = nearest_flag(given, known);
      std::cerr << tool << ": unknown flag " << given
                << (near.empty() ? "; see --help" : "; did you mean " + near + "?") << std::endl;
      return 2;
    }
    if (!bare_words.empty()) {
      std::cerr << tool << ": " << bare_words << std::endl;
      return 2;
    }
    std::cerr << tool << ": unexpected arguments:";
    for (const std::string& extra : app.remaining()) std::cerr << " " << extra;
    std::cerr << "; see --help" << std::endl;
    return 2;
  } catch (const CLI::ParseError& e) {
    // --help (and --help-all) print and exit 0; every other error is a bad flag or value: one
    // line naming it, exit 2, as argparse (torchrun) does.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << tool << ": " << e.what() << "; see --help" << std::endl;
    return 2;
  }
}

}  // namespace ddp::tools
