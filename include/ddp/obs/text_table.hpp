#pragma once
// A boxed text table, the layout of DDPOptimizer's tabulate output that the bucket table and the
// unit table print:
//   +-------+----------+-------------+
//   | Index | Size (b) | Param Names |
//   +-------+----------+-------------+
//   |     0 |     4096 | fc4.weight  |
//   +-------+----------+-------------+
// Ground floor: plain strings in, a string out.

#include <string>
#include <vector>

namespace ddp::obs {

// `header` and every row have one cell per column; a column whose `right_aligned` entry is true
// (numbers) is padded on the left, the others on the right. Ends with a newline.
std::string format_text_table(const std::vector<std::string>& header,
                              const std::vector<std::vector<std::string>>& rows,
                              const std::vector<bool>& right_aligned);

}  // namespace ddp::obs
