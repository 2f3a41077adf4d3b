#pragma once
// SHA-256 (FIPS 180-4) of bytes and of files, through OpenSSL's EVP interface: what a checkpoint
// manifest records, and what `sha256sum` prints, so a user can check a checkpoint by hand.
// OpenSSL rather than our own rounds: it is reviewed, and its SHA-NI code hashed 1.5 GB/s on one
// core here (docs/dependencies.md), which matters for verifying multi-GB checkpoints on every rank.
// Torch-free, like posix_file.hpp.

#include <string>

namespace ddp::io {

// Lower-case hex digest of a byte string.
std::string sha256_hex(const std::string& bytes);

// Lower-case hex digest of a file's bytes, read in 1 MiB chunks. Throws FileError naming the file
// when it cannot be opened or read.
std::string sha256_file(const std::string& path);

}  // namespace ddp::io
