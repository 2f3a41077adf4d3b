#include "ddp/files/posix_file.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace ddp::files {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw FileError("ddp: " + what + ": " + std::strerror(err), path, err);
}

std::string in_quotes(const std::string& path) { return "'" + path + "'"; }

}  // namespace

int write_all(int fd, const void* data, size_t size) noexcept {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;  // no progress and no error: give up rather than spin
    p += n;
    size -= size_t(n);
  }
  return 0;
}

void fsync_directory(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory " + in_quotes(d) + " to fsync it", d, errno);
  const int synced = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (synced != 0) fail("fsync of directory " + in_quotes(d) + " failed", d, err);
}

int remove_tree(const std::string& path) noexcept {
  // Children before their directory (FTW_DEPTH), links as links (FTW_PHYS); the callback's
  // nonzero return (an errno) stops the walk and is what nftw returns.
  const auto remove_entry = [](const char* entry, const struct stat*, int, struct FTW*) {
    return ::remove(entry) == 0 || errno == ENOENT ? 0 : errno;
  };
  const int walked = ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (walked == -1) return errno == ENOENT ? 0 : errno;
  return walked;
}

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create " + in_quotes(tmp_) + " to write", tmp_, errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  if (fd_ < 0) fail("writing " + in_quotes(tmp_) + " after it was closed", tmp_, EBADF);
  const int err = write_all(fd_, data, size);
  if (err != 0) fail("writing " + in_quotes(tmp_) + " failed", tmp_, err);
}

void AtomicFile::commit() {
  if (fd_ < 0) fail("committing " + in_quotes(tmp_) + " twice", tmp_, EBADF);
  // Data first, then the name: a rename that reached the disk before the data would publish a
  // file of zeros after a crash.
  if (::fsync(fd_) != 0) fail("fsync of " + in_quotes(tmp_) + " failed", tmp_, errno);
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) fail("closing " + in_quotes(tmp_) + " failed", tmp_, errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    fail("renaming " + in_quotes(tmp_) + " to " + in_quotes(path_) + " failed", path_, errno);
  }
  committed_ = true;
  // The rename itself is durable only once the directory entry is.
  fsync_directory(std::filesystem::path(path_).parent_path().string());
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFile file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

}  // namespace ddp::files
