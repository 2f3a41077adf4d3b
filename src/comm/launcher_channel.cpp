#include "ddp/comm/launcher_channel.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ddp::comm {

namespace {

// The pipe's descriptor, read from the environment once; -1: no launcher listens.
int channel() {
  static const int fd = [] {
    const char* text = std::getenv(kLauncherFdVar);
    if (text == nullptr || *text == '\0') return -1;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (*end != '\0' || value < 0 || value > 1 << 20) return -1;
    const int descriptor = static_cast<int>(value);
    // Only a pipe's write end that is still open: a program that closed it, or reused the
    // number for a file of its own, is left alone.
    const int flags = ::fcntl(descriptor, F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) != O_WRONLY) return -1;
    ::fcntl(descriptor, F_SETFD, FD_CLOEXEC);  // not for what this worker runs itself
    return descriptor;
  }();
  return fd;
}

void tell(const char* line, size_t size) {
  const int fd = channel();
  if (fd < 0) return;
  // The launcher set O_NONBLOCK on the pipe: a full pipe drops the line, never stalls a step.
  (void)!::write(fd, line, size);
}

}  // namespace

void tell_launcher_ready() {
  static std::atomic<bool> told{false};
  if (!told.exchange(true)) tell("ready\n", 6);
}

void tell_launcher_step(int64_t step) {
  char line[32];
  const int n = std::snprintf(line, sizeof(line), "step %lld\n", static_cast<long long>(step));
  if (n > 0) tell(line, static_cast<size_t>(n));
}

}  // namespace ddp::comm
