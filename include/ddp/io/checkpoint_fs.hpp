#pragma once
// Durable file-system steps shared by checkpoints and the torch.save writer: whole-file atomic
// writes, directory fsyncs, and the SHA-256 of a file's bytes (what a manifest records, and what
// `sha256sum` prints, so a user can check a checkpoint by hand).

#include <cstdint>
#include <string>

namespace ddp::io {

// Writes `bytes` to "<path>.tmp.<pid>", fsyncs it, renames it over `path` and fsyncs the
// directory: a crash leaves the old file or the new one, never half of one. Throws c10::Error
// naming the path and errno's text.
void write_file_atomic(const std::string& path, const std::string& bytes);

// fsync of a directory, so that the entries created or renamed in it are durable.
void fsync_directory(const std::string& dir);

// Lower-case hex SHA-256 (FIPS 180-4) of a byte string, and of a file's bytes read in 1 MiB
// chunks. Throughput is a few hundred MB/s per core: seconds for a multi-GB checkpoint, small next
// to writing it.
std::string sha256_hex(const std::string& bytes);
std::string sha256_file(const std::string& path);

}  // namespace ddp::io
