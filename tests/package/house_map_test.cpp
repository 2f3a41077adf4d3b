// docs/design/house.md, the map a new engineer reads first, stays true: every folder of src/ and
// include/ddp/ is a layer line of it ("  <folder>/ ..."), every layer line names a folder that
// exists, and the README links it.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::set<std::string> folders(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_directory()) out.insert(entry.path().filename().string());
  }
  return out;
}

TEST(HouseMap, EveryFolderIsOnTheMapAndTheReadmeLinksIt) {
  const std::string root = DDP_SOURCE_DIR;
  const std::string map = read(root + "/docs/design/house.md");
  ASSERT_FALSE(map.empty()) << "docs/design/house.md is missing";
  // The layer lines: two spaces, the folder, a slash.
  std::set<std::string> layers;
  const std::regex line(R"(\n  ([a-z]+)/)");
  for (std::sregex_iterator it(map.begin(), map.end(), line), end; it != end; ++it) {
    layers.insert((*it)[1].str());
  }
  std::set<std::string> code = folders(root + "/src");
  for (const std::string& f : folders(root + "/include/ddp")) code.insert(f);
  for (const std::string& f : code) {
    EXPECT_EQ(layers.count(f), 1u)
        << "folder " << f << "/ (src/ or include/ddp/) is not on the map";
  }
  for (const std::string& f : layers) {
    EXPECT_EQ(code.count(f), 1u) << "the map names " << f << "/, which is no folder of the code";
  }
  EXPECT_NE(read(root + "/README.md").find("docs/design/house.md"), std::string::npos)
      << "README.md does not link the map";
}

}  // namespace
