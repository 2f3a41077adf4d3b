#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <map>

#include "ddp/comm/env.hpp"

namespace ddp::comm {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    world_info_from_env(env_of(std::move(vars)));
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

const std::map<std::string, std::string> kGood = {{"RANK", "2"},
                                                  {"WORLD_SIZE", "3"},
                                                  {"LOCAL_RANK", "1"},
                                                  {"MASTER_ADDR", "10.0.0.7"},
                                                  {"MASTER_PORT", "29511"}};

TEST(Env, ReadsTheTorchrunVariables) {
  const WorldInfo info = world_info_from_env(env_of(kGood));
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 3);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "10.0.0.7");
  EXPECT_EQ(info.master_port, 29511);
}

TEST(Env, LocalRankDefaultsToZero) {
  auto vars = kGood;
  vars.erase("LOCAL_RANK");
  EXPECT_EQ(world_info_from_env(env_of(vars)).local_rank, 0);
}

TEST(Env, MissingVariablesAreNamed) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    auto vars = kGood;
    vars.erase(name);
    EXPECT_NE(error_of(vars).find(std::string("environment variable ") + name + " is not set"),
              std::string::npos)
        << name << ": " << error_of(vars);
  }
}

TEST(Env, InvalidValuesNameTheVariableAndTheRange) {
  struct Case {
    const char* name;
    const char* value;
    const char* expected;
  };
  for (const Case& c : {Case{"RANK", "3", "RANK='3' is invalid: expected an integer in [0, 2]"},
                        Case{"RANK", "-1", "RANK='-1' is invalid"},
                        Case{"WORLD_SIZE", "two", "WORLD_SIZE='two' is invalid"},
                        Case{"WORLD_SIZE", "0", "WORLD_SIZE='0' is invalid"},
                        Case{"MASTER_PORT", "70000",
                             "MASTER_PORT='70000' is invalid: expected an integer in [1, 65535]"},
                        Case{"MASTER_PORT", "29500x", "MASTER_PORT='29500x' is invalid"},
                        Case{"LOCAL_RANK", "", "LOCAL_RANK='' is invalid"}}) {
    auto vars = kGood;
    vars[c.name] = c.value;
    EXPECT_NE(error_of(vars).find(c.expected), std::string::npos) << error_of(vars);
  }
}

}  // namespace
}  // namespace ddp::comm
