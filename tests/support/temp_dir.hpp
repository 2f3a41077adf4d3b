#pragma once
// A fresh private directory for a test's files, removed with everything in it.

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "ddp/files/posix_file.hpp"

namespace ddp::testing {

struct TempDir {
  std::filesystem::path path;
  // `prefix` names the test in the directory's name (under $TMPDIR or /tmp), for a reader of /tmp.
  explicit TempDir(const std::string& prefix = "ddp_test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("mkdtemp failed: " + pattern);
    path = pattern;
  }
  ~TempDir() { ddp::files::remove_tree(path.string()); }  // not std::filesystem's: posix_file.hpp
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string str() const { return path.string(); }
};

}  // namespace ddp::testing
