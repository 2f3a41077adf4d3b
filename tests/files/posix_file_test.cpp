// The one POSIX file helper: whole bytes out through EINTR and short writes, atomic replacement,
// and failures that name the file and errno's text while leaving the old file as it was.

#include "ddp/files/posix_file.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/linear.h>

#include "ddp/io/checkpoint.hpp"
#include "ddp/io/safetensors.hpp"
#include "ddp/io/sha256.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using ddp::files::FileError;
using ddp::testing::read_file;
using ddp::testing::TempDir;

// Files in `dir`, by name: a failed write must leave no temporary file behind.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A full disk, for this process only and even as root: files may not grow past `bytes`
// (RLIMIT_FSIZE), so a write past it fails with EFBIG ("File too large") instead of raising
// SIGXFSZ, which is ignored meanwhile.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  sighandler_t old_handler_;
};

template <typename Error>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PosixFile, AtomicWriteReplacesTheWholeFile) {
  TempDir dir;
  const std::string path = dir.file("f");
  ddp::files::write_file_atomic(path, "first version, longer");
  ddp::files::write_file_atomic(path, "second");
  EXPECT_EQ(read_file(path), "second");
  ddp::files::write_file_atomic(path, "");
  EXPECT_EQ(read_file(path), "");
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"f"});
}

TEST(PosixFile, RemoveTreeRemovesEverythingAndFollowsNoLink) {
  TempDir dir;
  const std::string outside = dir.file("outside");
  ddp::files::write_file_atomic(outside, "kept");
  const std::string tree = dir.file("tree");
  fs::create_directories(tree + "/a/b");
  ddp::files::write_file_atomic(tree + "/a/b/f", "x");
  ddp::files::write_file_atomic(tree + "/g", "y");
  fs::create_symlink(outside, tree + "/a/link");
  fs::create_directory_symlink(dir.path, tree + "/up");  // a cycle if links were followed
  EXPECT_EQ(ddp::files::remove_tree(tree), 0);
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"outside"});
  EXPECT_EQ(read_file(outside), "kept");
  EXPECT_EQ(ddp::files::remove_tree(tree), 0);     // missing: nothing to do
  EXPECT_EQ(ddp::files::remove_tree(outside), 0);  // a plain file
  EXPECT_FALSE(fs::exists(outside));
}

TEST(PosixFile, AFullDiskLeavesTheOldFileAndNamesTheFile) {
  TempDir dir;
  const std::string path = dir.file("weights");
  const std::string old_bytes(10000, 'o');
  ddp::files::write_file_atomic(path, old_bytes);
  std::string message;
  int error_number = 0;
  std::string error_path;
  {
    FileSizeLimit limit(4096);
    try {
      ddp::files::write_file_atomic(path, std::string(20000, 'n'));
    } catch (const FileError& e) {
      message = e.what();
      error_number = e.error_number();
      error_path = e.path();
    }
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  EXPECT_EQ(message, "ddp: writing '" + tmp + "' failed: " + std::strerror(EFBIG));
  EXPECT_EQ(error_number, EFBIG);
  EXPECT_EQ(error_path, tmp);
  EXPECT_EQ(read_file(path), old_bytes);
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"weights"});
}

TEST(PosixFile, AParentThatIsAFileIsNamed) {
  TempDir dir;
  ddp::files::write_file_atomic(dir.file("plain"), "x");
  const std::string path = dir.file("plain") + "/f";
  EXPECT_EQ(error_of<FileError>([&] { ddp::files::write_file_atomic(path, "y"); }),
            "ddp: cannot create '" + path + ".tmp." + std::to_string(::getpid()) +
                "' to write: " + std::strerror(ENOTDIR));
  EXPECT_EQ(read_file(dir.file("plain")), "x");
}

TEST(PosixFile, AReadOnlyDirectoryKeepsTheOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  TempDir dir;
  const std::string path = dir.file("f");
  ddp::files::write_file_atomic(path, "old");
  fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string err = error_of<FileError>([&] { ddp::files::write_file_atomic(path, "new"); });
  fs::permissions(dir.path, fs::perms::owner_all);
  EXPECT_EQ(err, "ddp: cannot create '" + path + ".tmp." + std::to_string(::getpid()) +
                     "' to write: " + std::strerror(EACCES));
  EXPECT_EQ(read_file(path), "old");
}

TEST(PosixFile, WriteAllGetsEveryByteThroughShortWrites) {
  // A pipe takes 64 KiB at a time: 8 MiB need many partial writes while the reader drains it.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::string bytes(8 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 31 + i / 4099);
  std::string got;
  std::thread reader([&] {
    char buf[65536];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) got.append(buf, size_t(n));
  });
  EXPECT_EQ(ddp::files::write_all(fds[1], bytes.data(), bytes.size()), 0);
  ::close(fds[1]);
  reader.join();
  ::close(fds[0]);
  EXPECT_TRUE(got == bytes) << got.size() << " of " << bytes.size() << " bytes arrived";
}

TEST(PosixFile, WriteAllReturnsTheErrno) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  const auto old = ::signal(SIGPIPE, SIG_IGN);
  EXPECT_EQ(ddp::files::write_all(fds[1], "x", 1), EPIPE);
  ::signal(SIGPIPE, old);
  ::close(fds[1]);
  EXPECT_EQ(ddp::files::write_all(-1, "x", 1), EBADF);
}

TEST(PosixFile, Sha256OfAMissingFileNamesIt) {
  TempDir dir;
  const std::string path = dir.file("absent");
  EXPECT_EQ(error_of<FileError>([&] { ddp::io::sha256_file(path); }),
            "ddp: cannot open '" + path + "' to read: " + std::strerror(ENOENT));
}

// The torch-side writers report a refused write as the c10::Error of their API, and keep what
// was saved before.
TEST(PosixFile, SafetensorsAndCheckpointsSurviveAFullDisk) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  ddp::io::save_safetensors(path, {{"w", at::ones({4})}});
  const std::string before = read_file(path);
  ddp::io::CheckpointOptions options;
  options.root = dir.file("ckpt");
  auto linear = torch::nn::Linear(4, 4);
  ddp::io::TrainingState state;
  state.model = linear.ptr().get();
  state.step = 1;
  const std::string saved = ddp::io::save_checkpoint(options, state);
  std::string safetensors_error, checkpoint_error;
  {
    FileSizeLimit limit(16384);
    safetensors_error = error_of<c10::Error>([&] {
      ddp::io::save_safetensors(path, {{"w", at::ones({100000})}});
    });
    auto big = torch::nn::Linear(1000, 100);
    state.model = big.ptr().get();
    state.step = 2;
    checkpoint_error = error_of<c10::Error>([&] { ddp::io::save_checkpoint(options, state); });
  }
  EXPECT_NE(safetensors_error.find("ddp: writing '" + path + ".tmp."), std::string::npos)
      << safetensors_error;
  EXPECT_NE(safetensors_error.find(std::strerror(EFBIG)), std::string::npos) << safetensors_error;
  EXPECT_EQ(read_file(path), before);
  EXPECT_NE(checkpoint_error.find("model.safetensors.tmp."), std::string::npos) << checkpoint_error;
  EXPECT_NE(checkpoint_error.find(std::strerror(EFBIG)), std::string::npos) << checkpoint_error;
  // Step 1 is intact and still the latest; no step-2 and no temporary directory remain.
  ASSERT_TRUE(ddp::io::find_latest_checkpoint(options.root).has_value());
  EXPECT_EQ(ddp::io::find_latest_checkpoint(options.root)->dir, saved);
  EXPECT_EQ(names_in(options.root), std::vector<std::string>{"step-1"});
}

}  // namespace

namespace {

// Every C and C++ file under the project's code folders whose text calls remove_all: the
// std::filesystem operation the torch wheel's libtorch.so replaces with a copy that crashes on a
// non-empty directory (docs/dependencies.md). Walked with nftw, not std::filesystem, for the same
// reason: this test also runs in the GPU stage against the wheel.
std::vector<std::string> files_calling_remove_all(const std::string& root) {
  static std::vector<std::string>* found = nullptr;
  std::vector<std::string> out;
  found = &out;
  const auto visit = [](const char* path, const struct stat*, int type, struct FTW*) {
    const std::string p = path;
    if (type != FTW_F) return 0;
    static const char* const kCode[] = {".cpp", ".hpp", ".h", ".c", ".cc"};
    const bool code = std::any_of(std::begin(kCode), std::end(kCode), [&](const char* ext) {
      const std::string e = ext;
      return p.size() > e.size() && p.compare(p.size() - e.size(), e.size(), e) == 0;
    });
    if (!code) return 0;
    std::ifstream in(p);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    static const std::regex kCall(R"(\bremove_all\s*\()");
    if (std::regex_search(text, kCall)) found->push_back(p);
    return 0;
  };
  for (const char* dir : {"src", "include", "tests", "tools", "models", "examples", "bench"}) {
    const std::string path = root + "/" + dir;
    if (::access(path.c_str(), F_OK) == 0) ::nftw(path.c_str(), visit, 16, FTW_PHYS);
  }
  found = nullptr;
  return out;
}

}  // namespace

TEST(PosixFile, NoFileOfTheTreeCallsTheWheelsBrokenRemoveAll) {
  const std::vector<std::string> offenders = files_calling_remove_all(DDP_SOURCE_DIR);
  std::string list;
  for (const auto& f : offenders) list += "\n  " + f;
  EXPECT_TRUE(offenders.empty())
      << "these files call std::filesystem::remove_all, which the torch wheel's libtorch.so "
         "replaces with a copy that crashes on a non-empty directory; use ddp::files::remove_tree:"
      << list;
}

TEST(PosixFile, TheRemoveAllCheckFindsACall) {
  // The check above must be able to fail: a tree with one calling file is found.
  TempDir dir("remove_all_check");
  ASSERT_EQ(::mkdir((dir.str() + "/src").c_str(), 0755), 0);
  // Spelled in two pieces so that this file itself holds no call.
  std::ofstream(dir.str() + "/src/bad.cpp") << "void f() { std::filesystem::remove_"
                                               "all (p); }\n";
  std::ofstream(dir.str() + "/src/good.cpp") << "// not std::filesystem::remove_all: remove_tree\n";
  const std::vector<std::string> offenders = files_calling_remove_all(dir.str());
  ASSERT_EQ(offenders.size(), 1u);
  EXPECT_EQ(offenders[0], dir.str() + "/src/bad.cpp");
}
