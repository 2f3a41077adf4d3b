#include "ddp/io/sha256.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "ddp/files/posix_file.hpp"

namespace ddp::io {
namespace {

// One digest in progress; EVP_MD_CTX is opaque in OpenSSL 3, so it lives on the heap.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    check(ctx_ != nullptr && EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1, "init");
  }
  void update(const void* data, size_t n) {
    check(EVP_DigestUpdate(ctx_.get(), data, n) == 1, "update");
  }
  std::string hex_digest() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    check(EVP_DigestFinal_ex(ctx_.get(), digest, &size) == 1, "final");
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < size; ++i) {
      out += digits[digest[i] >> 4];
      out += digits[digest[i] & 0xf];
    }
    return out;
  }

 private:
  // Only an allocation failure or a broken OpenSSL install makes EVP fail for SHA-256.
  static void check(bool ok, const char* step) {
    if (!ok) throw std::runtime_error(std::string("ddp: OpenSSL SHA-256 ") + step + " failed");
  }
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

}  // namespace

std::string sha256_hex(const std::string& bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  return h.hex_digest();
}

std::string sha256_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw files::FileError("ddp: cannot open '" + path + "' to read: " + std::strerror(err), path,
                           err);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  Sha256 h;
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      throw files::FileError("ddp: reading '" + path + "' failed: " + std::strerror(err), path,
                             err);
    }
    if (n == 0) break;
    h.update(buf.data(), size_t(n));
  }
  return h.hex_digest();
}

}  // namespace ddp::io
