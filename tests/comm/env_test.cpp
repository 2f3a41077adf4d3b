#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>

#include "ddp/comm/env.hpp"
#include "ddp/comm/init.hpp"

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

TEST(Env, ReadsOpenMpiRankSizeAndLocalRank) {
  const WorldInfo info = world_info_from_env(env_of({{"OMPI_COMM_WORLD_RANK", "4"},
                                                     {"OMPI_COMM_WORLD_SIZE", "6"},
                                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                     {"MASTER_ADDR", "node0"},
                                                     {"MASTER_PORT", "29600"}}));
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 4);
  EXPECT_EQ(info.world_size, 6);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "node0");
  EXPECT_EQ(info.master_port, 29600);
}

TEST(Env, ReadsSlurmProcIdTasksAndLocalId) {
  const WorldInfo info = world_info_from_env(env_of({{"SLURM_PROCID", "5"},
                                                     {"SLURM_NTASKS", "8"},
                                                     {"SLURM_LOCALID", "3"},
                                                     {"MASTER_ADDR", "10.1.2.3"},
                                                     {"MASTER_PORT", "29700"}}));
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 3);
  EXPECT_EQ(info.master_addr, "10.1.2.3");
}

TEST(Env, TorchrunVariablesWinOverMpiAndSlurm) {
  auto vars = kGood;
  vars["OMPI_COMM_WORLD_RANK"] = "0";
  vars["OMPI_COMM_WORLD_SIZE"] = "1";
  vars["SLURM_PROCID"] = "0";
  vars["SLURM_NTASKS"] = "1";
  const WorldInfo info = world_info_from_env(env_of(vars));
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 3);
}

// What ddp-train and ddp-bench ask before deciding to spawn their own workers: under mpirun or
// srun (no RANK) they must run as one worker, as world_info_from_env will read those variables.
TEST(Env, LauncherIsTheOneWhoseRankIsSet) {
  EXPECT_EQ(launcher_from_env(env_of({{"MASTER_PORT", "1"}})), std::nullopt);
  EXPECT_EQ(launcher_from_env(env_of({{"OMPI_COMM_WORLD_RANK", "1"}})), "openmpi");
  EXPECT_EQ(launcher_from_env(env_of({{"SLURM_PROCID", "0"}})), "slurm");
  EXPECT_EQ(launcher_from_env(env_of({{"SLURM_PROCID", "0"}, {"OMPI_COMM_WORLD_RANK", "0"}})),
            "openmpi");
  EXPECT_EQ(launcher_from_env(env_of({{"RANK", "0"}, {"OMPI_COMM_WORLD_RANK", "1"}})), "torchrun");
  // The same launcher as world_info_from_env reports.
  EXPECT_EQ(world_info_from_env(env_of({{"SLURM_PROCID", "1"},
                                        {"SLURM_NTASKS", "2"},
                                        {"MASTER_ADDR", "a"},
                                        {"MASTER_PORT", "1"}}))
                .launcher,
            launcher_from_env(env_of({{"SLURM_PROCID", "1"}})));
}

TEST(Env, MpiAndSlurmErrorsNameTheirOwnVariables) {
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}})
                .find("environment variable OMPI_COMM_WORLD_SIZE is not set"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "9"},
                      {"SLURM_NTASKS", "4"},
                      {"MASTER_ADDR", "a"},
                      {"MASTER_PORT", "1"}})
                .find("environment variable SLURM_PROCID='9' is invalid: expected an integer in "
                      "[0, 3]"),
            std::string::npos);
  // Under srun the master must still be given: the error says which variable.
  EXPECT_NE(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"MASTER_PORT", "1"}})
                .find("environment variable MASTER_ADDR is not set"),
            std::string::npos);
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

// The collective timeout from the launcher (ddp-run --timeout-s sets DDP_TIMEOUT_S): seconds, a
// fraction allowed; unset or empty, PyTorch's 5 minutes; anything else refused by name.
TEST(Env, TheCollectiveTimeoutComesFromDdpTimeoutS) {
  const char* saved = std::getenv("DDP_TIMEOUT_S");
  const std::string kept = saved ? saved : "";
  ::unsetenv("DDP_TIMEOUT_S");
  EXPECT_EQ(ddp::comm::default_collective_timeout(), std::chrono::minutes(5));
  ::setenv("DDP_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(ddp::comm::default_collective_timeout(), std::chrono::milliseconds(2500));
  EXPECT_EQ(ddp::comm::InitOptions{}.timeout, std::chrono::milliseconds(2500));
  for (const char* bad : {"0", "-3", "ten", "5s"}) {
    ::setenv("DDP_TIMEOUT_S", bad, 1);
    try {
      ddp::comm::default_collective_timeout();
      ADD_FAILURE() << bad << " accepted";
    } catch (const c10::Error& e) {
      EXPECT_EQ(std::string(e.what_without_backtrace()),
                std::string("ddp: DDP_TIMEOUT_S='") + bad +
                    "' is not a collective timeout: expected a positive number of seconds");
    }
  }
  if (saved) {
    ::setenv("DDP_TIMEOUT_S", kept.c_str(), 1);
  } else {
    ::unsetenv("DDP_TIMEOUT_S");
  }
}
