#pragma once
// The text of the c10::Error that `fn` throws, without the backtrace; "" when it throws none.
// Tests compare it with the exact message an API boundary promises.

#include <c10/util/Exception.h>

#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace ddp::testing {

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// In a worker: `fn` must throw a c10::Error whose text holds every one of `parts`; otherwise
// throws (the worker's failure) with the parts wanted and the text got.
inline void require_error_says(const std::function<void()>& fn,
                               std::initializer_list<std::string> parts) {
  const std::string error = error_of(fn);
  for (const std::string& part : parts) {
    if (error.find(part) == std::string::npos) {
      throw std::runtime_error("want an error saying '" + part + "', got: '" + error + "'");
    }
  }
}

}  // namespace ddp::testing
