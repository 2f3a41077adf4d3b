#include "common/json_stdout.hpp"

#include <unistd.h>

#include <cstdio>
#include <iostream>

namespace ddp::tools {
namespace {

int json_fd = -1;  // the original stdout once reserved; -1 before

}  // namespace

void reserve_stdout_for_json() {
  if (json_fd >= 0) return;
  std::cout.flush();
  std::fflush(stdout);
  json_fd = ::dup(STDOUT_FILENO);
  if (json_fd < 0) return;  // no spare descriptor: stdout stays shared
  ::dup2(STDERR_FILENO, STDOUT_FILENO);
}

void print_json_line(const std::string& json) {
  if (json_fd < 0) {
    std::cout << json << "\n" << std::flush;
    return;
  }
  const std::string line = json + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(json_fd, line.data() + done, line.size() - done);
    if (n <= 0) return;  // a closed pipe: the reader is gone
    done += static_cast<size_t>(n);
  }
}

}  // namespace ddp::tools
