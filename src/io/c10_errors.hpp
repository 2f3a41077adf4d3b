#pragma once
// libddp's io API reports every failure as a c10::Error (what its callers catch: ddp-train, the
// checkpoint skip in find_latest_checkpoint). The torch-free file helpers throw FileError; the
// public torch-side functions run their body through as_c10_error so that it reaches the caller
// as a c10::Error with the same text.

#include <c10/util/Exception.h>

#include <string>

#include "ddp/files/posix_file.hpp"

namespace ddp::io {

// An error's text to quote inside another's: "ddp: x" -> "x" (the outer one says "ddp: ").
inline std::string without_ddp_prefix(std::string text) {
  const std::string p = "ddp: ";
  if (text.rfind(p, 0) == 0) text.erase(0, p.size());
  return text;
}

template <typename Fn>
decltype(auto) as_c10_error(Fn&& fn) {
  try {
    return fn();
  } catch (const files::FileError& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace ddp::io
