#pragma once
// Relays one worker stream (stdout or stderr, read from a pipe in arbitrary chunks) to the
// launcher's own stream, a whole line at a time with a prefix such as "[rank 1] ". Without a
// prefix the bytes pass as they come (a redrawn progress bar shows without waiting for a newline).
//
// Each line goes out in a single write(2), so lines of different workers never interleave
// mid-line, whatever the pipe's chunking was. A final line without a newline is printed (with
// one) when the stream ends. A line longer than kMaxLine is cut there: memory stays bounded
// for a worker that writes a huge line or binary data.

#include <cstddef>
#include <string>
#include <utility>

namespace ddp::launch {

class LineRelay {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;

  LineRelay(std::string prefix, int out_fd) : prefix_(std::move(prefix)), out_fd_(out_fd) {}

  void feed(const char* data, size_t size);  // bytes as read from the pipe
  void finish();                             // the stream ended: flush a partial line

 private:
  void emit(const char* line, size_t size);

  std::string prefix_;
  int out_fd_;
  std::string pending_;  // the current line's bytes so far, without its newline
};

}  // namespace ddp::launch
