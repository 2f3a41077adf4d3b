#include "ddp/io/checkpoint_fs.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <c10/util/Exception.h>

namespace ddp::io {
namespace {

// SHA-256 as FIPS 180-4 specifies it: eight 32-bit words of state, 64-byte blocks, 64 rounds.
class Sha256 {
 public:
  void update(const unsigned char* data, size_t n) {
    total_bytes_ += n;
    while (n > 0) {
      const size_t take = std::min(n, size_t(64) - fill_);
      std::memcpy(block_.data() + fill_, data, take);
      fill_ += take;
      data += take;
      n -= take;
      if (fill_ == 64) {
        compress(block_.data());
        fill_ = 0;
      }
    }
  }

  std::string hex_digest() {
    // Padding: a 1 bit, zeros up to 56 mod 64 bytes, then the message length in bits, big-endian.
    const uint64_t bits = total_bytes_ * 8;
    const unsigned char one = 0x80, zero = 0;
    update(&one, 1);
    while (fill_ != 56) update(&zero, 1);
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(length, 8);
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (uint32_t word : h_)
      for (int shift = 28; shift >= 0; shift -= 4) out += digits[(word >> shift) & 0xf];
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void compress(const unsigned char* p) {
    static constexpr uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 |
             uint32_t(p[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 =
          h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::array<uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<unsigned char, 64> block_{};
  size_t fill_ = 0;           // bytes of block_ filled, < 64 between calls
  uint64_t total_bytes_ = 0;  // message length so far, for the padding
};

// Closes the descriptor on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void fsync_directory(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  Fd fd{::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  TORCH_CHECK(fd.fd >= 0, "ddp: cannot open directory '", d,
              "' to fsync it: ", std::strerror(errno));
  TORCH_CHECK(::fsync(fd.fd) == 0, "ddp: fsync of directory '", d,
              "' failed: ", std::strerror(errno));
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  bool renamed = false;
  struct Cleanup {
    const std::string& tmp;
    const bool& renamed;
    ~Cleanup() {
      if (!renamed) ::unlink(tmp.c_str());
    }
  } cleanup{tmp, renamed};
  {
    Fd fd{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    TORCH_CHECK(fd.fd >= 0, "ddp: cannot create '", tmp, "' to write: ", std::strerror(errno));
    const char* p = bytes.data();
    size_t left = bytes.size();
    while (left > 0) {
      const ssize_t n = ::write(fd.fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      TORCH_CHECK(n > 0, "ddp: writing '", tmp, "' failed: ", std::strerror(errno));
      p += n;
      left -= size_t(n);
    }
    TORCH_CHECK(::fsync(fd.fd) == 0, "ddp: fsync of '", tmp, "' failed: ", std::strerror(errno));
    const int closed = ::close(fd.fd);
    fd.fd = -1;
    TORCH_CHECK(closed == 0, "ddp: closing '", tmp, "' failed: ", std::strerror(errno));
  }
  TORCH_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "ddp: renaming '", tmp, "' to '", path,
              "' failed: ", std::strerror(errno));
  renamed = true;
  fsync_directory(std::filesystem::path(path).parent_path().string());
}

std::string sha256_hex(const std::string& bytes) {
  Sha256 h;
  h.update(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return h.hex_digest();
}

std::string sha256_file(const std::string& path) {
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  TORCH_CHECK(fd.fd >= 0, "ddp: cannot open '", path, "' to read: ", std::strerror(errno));
  Sha256 h;
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd.fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n >= 0, "ddp: reading '", path, "' failed: ", std::strerror(errno));
    if (n == 0) break;
    h.update(buf.data(), size_t(n));
  }
  return h.hex_digest();
}

}  // namespace ddp::io
