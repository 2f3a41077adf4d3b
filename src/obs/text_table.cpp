#include "ddp/obs/text_table.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace ddp::obs {

std::string format_text_table(const std::vector<std::string>& header,
                              const std::vector<std::vector<std::string>>& rows,
                              const std::vector<bool>& right_aligned) {
  const size_t columns = header.size();
  if (right_aligned.size() != columns) {
    throw std::invalid_argument("format_text_table: one alignment per column");
  }
  std::vector<size_t> width(columns);
  for (size_t c = 0; c < columns; ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    if (row.size() != columns) throw std::invalid_argument("format_text_table: ragged row");
    for (size_t c = 0; c < columns; ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::ostringstream out;
  const auto rule = [&] {
    for (size_t c = 0; c < columns; ++c) out << '+' << std::string(width[c] + 2, '-');
    out << "+\n";
  };
  const auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < columns; ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      out << "| " << (right_aligned[c] ? pad + cells[c] : cells[c] + pad) << ' ';
    }
    out << "|\n";
  };
  rule();
  line(header);
  rule();
  for (const auto& row : rows) line(row);
  rule();
  return out.str();
}

}  // namespace ddp::obs
