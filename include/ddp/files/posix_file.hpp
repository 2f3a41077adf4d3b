#pragma once
// The one place libddp puts bytes into files and pipes: write(2) until done, fsync, rename, and the
// fsync of a directory, and from them a whole-file atomic write. Checkpoints, safetensors,
// torch.save files, ddp-run's output relay and the flight recorder's dumps all go through here.
// The ground floor of the house (files/): comm/ (the recorder) and launch/ use it as io/ does.
//
// Torch-free on purpose: ddp-run (no libtorch, for its start-up time) links it through ddp_launch.
// Failures throw FileError, a std::runtime_error naming the file and errno's text
// ("ddp: writing '/ckpt/.tmp-step-5-77/model.safetensors.tmp.77' failed: No space left on device");
// the torch-side io functions pass it on as the c10::Error their API promises.

#include <cstddef>
#include <stdexcept>
#include <string>

namespace ddp::files {

class FileError : public std::runtime_error {
 public:
  FileError(const std::string& message, std::string path, int error_number)
      : std::runtime_error(message), path_(std::move(path)), error_number_(error_number) {}
  const std::string& path() const noexcept { return path_; }   // the file or directory at fault
  int error_number() const noexcept { return error_number_; }  // errno of the failing call

 private:
  std::string path_;
  int error_number_;
};

// write(2) until all `size` bytes are out, retrying on EINTR and short writes. Returns 0, or the
// errno of the write that failed (a write that returns 0 counts as EIO). Does not throw: a caller
// relaying output to a closed terminal (EPIPE) decides for itself whether that matters.
int write_all(int fd, const void* data, size_t size) noexcept;

// fsync of a directory ("" means "."), so that the entries created or renamed in it are durable.
void fsync_directory(const std::string& dir);

// A file that appears whole or not at all. The bytes go to "<path>.tmp.<pid>"; commit() fsyncs
// and closes it, renames it over `path` and fsyncs the directory, so a crash leaves the old file
// or the new one, never half of one. Destroyed without a successful commit() (a write failed, an
// exception passed), the temporary file is removed and `path` is as it was.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // creates the temporary file; throws if it cannot
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size);  // appends; throws FileError (e.g. ENOSPC, EFBIG)
  void commit();                              // publishes `path`; throws FileError
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;             // the temporary file, -1 once closed
  bool committed_ = false;  // renamed over path_: the temporary file no longer exists
};

// Removes `path` and everything under it, as `rm -rf` (symbolic links are removed, not followed).
// A missing `path` is no error. Returns 0, or the errno of the first entry that could not be
// removed; does not throw. libddp's one recursive delete, instead of std::filesystem::remove_all:
// torch 2.x wheels' libtorch.so exports its own copy of the std::filesystem operations, which a
// program linking it resolves ahead of libstdc++'s, and that copy's remove_all of a non-empty
// directory calls a null function (SIGSEGV, seen with torch 2.11+cu130; docs/dependencies.md).
int remove_tree(const std::string& path) noexcept;

// AtomicFile in one call: `path` holds exactly `bytes` afterwards, or what it held before.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace ddp::files
