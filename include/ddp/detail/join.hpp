#pragma once
// "a, b, c": a list in an error message, the one way every layer writes it.

#include <sstream>
#include <string>
#include <vector>

namespace ddp::detail {

template <typename T>
std::string join(const std::vector<T>& items, const char* separator = ", ") {
  std::ostringstream out;
  for (size_t i = 0; i < items.size(); ++i) out << (i ? separator : "") << items[i];
  return out.str();
}

}  // namespace ddp::detail
