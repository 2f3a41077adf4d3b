#include "ddp/launch/line_relay.hpp"

#include <cstring>

#include "ddp/files/posix_file.hpp"

namespace ddp::launch {

void LineRelay::feed(const char* data, size_t size) {
  if (prefix_.empty()) {
    // Nothing to put in front: the bytes go on as they come, so that a partial line (a progress
    // bar redrawn with '\r') shows at once instead of at its newline.
    (void)files::write_all(out_fd_, data, size);
    return;
  }
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
  // Our stdout/stderr is gone (EPIPE with SIGPIPE ignored, EBADF): nothing useful to do with the
  // output, and the workers must not be stopped for it.
  (void)files::write_all(out_fd_, out.data(), out.size());
}

}  // namespace ddp::launch
