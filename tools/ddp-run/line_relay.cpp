#include "line_relay.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddp::run {

void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    // Our stdout/stderr is gone (EPIPE with SIGPIPE ignored, EBADF): nothing useful to do with
    // the output, and the workers must not be stopped for it.
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void LineRelay::feed(const char* data, size_t size) {
  while (size > 0) {
    const void* nl = std::memchr(data, '\n', size);
    const size_t take = nl ? static_cast<const char*>(nl) - data : size;
    if (nl == nullptr && pending_.size() + take < kMaxLine) {
      pending_.append(data, take);
      return;
    }
    if (nl == nullptr) {
      // Cut an over-long line at kMaxLine; the rest starts the next piece.
      const size_t room = kMaxLine - pending_.size();
      pending_.append(data, room);
      emit(pending_.data(), pending_.size());
      pending_.clear();
      data += room;
      size -= room;
      continue;
    }
    if (pending_.empty()) {
      emit(data, take);
    } else {
      pending_.append(data, take);
      emit(pending_.data(), pending_.size());
      pending_.clear();
    }
    data += take + 1;
    size -= take + 1;
  }
}

void LineRelay::finish() {
  if (!pending_.empty()) emit(pending_.data(), pending_.size());
  pending_.clear();
}

void LineRelay::emit(const char* line, size_t size) {
  std::string out;
  out.reserve(prefix_.size() + size + 1);
  out.append(prefix_).append(line, size).push_back('\n');
  write_all(out_fd_, out);
}

}  // namespace ddp::run
