#pragma once
// The text of the c10::Error that `fn` throws, without the backtrace; "" when it throws none.
// Tests compare it with the exact message an API boundary promises.

#include <c10/util/Exception.h>

#include <functional>
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

}  // namespace ddp::testing
