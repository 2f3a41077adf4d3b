#pragma once
// How a tool reports an error it caught: one "<tool>: " prefix, whoever wrote the message. Errors
// come from the library ("ddp: ..."), from tools/common (which may already name the tool it
// serves) and from the tool itself; without this, a message from tools/common went out as
// "ddp-train: ddp-train: --tp 3 does not divide ...".

#include <string>

namespace ddp::tools {

inline std::string tool_error(const std::string& tool, const std::string& what) {
  const std::string prefix = tool + ": ";
  return what.compare(0, prefix.size(), prefix) == 0 ? what : prefix + what;
}

}  // namespace ddp::tools
