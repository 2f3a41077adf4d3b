#include "ddp/comm/env.hpp"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>

namespace ddp::comm {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

namespace {

// Parses a whole decimal integer in [lo, hi]; anything else names the variable and the range.
long parse_int(const std::string& name, const std::string& text, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  const bool ok = !text.empty() && end != nullptr && *end == '\0' && errno == 0;
  TORCH_CHECK(ok && value >= lo && value <= hi, "ddp: environment variable ", name, "='", text,
              "' is invalid: expected an integer in [", lo, ", ", hi, "]");
  return value;
}

std::string require(const EnvLookup& env, const std::string& name, const std::string& what) {
  auto value = env(name);
  TORCH_CHECK(value.has_value(), "ddp: environment variable ", name, " is not set: expected ", what,
              " (set it, or start the workers with ddp-run, torchrun or ddp-train --nproc N)");
  return *value;
}

}  // namespace

std::optional<std::string> launcher_from_env(const EnvLookup& env) {
  // torchrun's names win when RANK is set (ddp-run and torchrun set it, and a user may set it by
  // hand under any launcher), else OpenMPI's, else Slurm's.
  if (env("RANK")) return "torchrun";
  if (env("OMPI_COMM_WORLD_RANK")) return "openmpi";
  if (env("SLURM_PROCID")) return "slurm";
  return std::nullopt;
}

WorldInfo world_info_from_env(const EnvLookup& env) {
  WorldInfo info;
  // Without any launcher's rank, torchrun's names: the error then asks for RANK and WORLD_SIZE.
  info.launcher = launcher_from_env(env).value_or("torchrun");
  std::string rank_var = "RANK", world_var = "WORLD_SIZE", local_var = "LOCAL_RANK";
  if (info.launcher == "openmpi") {
    rank_var = "OMPI_COMM_WORLD_RANK";
    world_var = "OMPI_COMM_WORLD_SIZE";
    local_var = "OMPI_COMM_WORLD_LOCAL_RANK";
  } else if (info.launcher == "slurm") {
    rank_var = "SLURM_PROCID";
    world_var = "SLURM_NTASKS";
    local_var = "SLURM_LOCALID";
  }
  const std::string world = require(env, world_var, "the number of workers, an integer >= 1");
  info.world_size = static_cast<int>(parse_int(world_var, world, 1, 1 << 20));
  const std::string rank =
      require(env, rank_var, "this worker's rank, an integer in [0, " + world_var + ")");
  info.rank = static_cast<int>(parse_int(rank_var, rank, 0, info.world_size - 1));
  if (auto local = env(local_var)) {
    info.local_rank = static_cast<int>(parse_int(local_var, *local, 0, info.world_size - 1));
  }
  info.master_addr = require(env, "MASTER_ADDR", "the host name or address of rank 0");
  TORCH_CHECK(!info.master_addr.empty(),
              "ddp: environment variable MASTER_ADDR is empty: expected ",
              "the host name or address of rank 0");
  const std::string port = require(env, "MASTER_PORT", "the TCP port of rank 0's store, 1..65535");
  info.master_port = static_cast<uint16_t>(parse_int("MASTER_PORT", port, 1, 65535));
  return info;
}

}  // namespace ddp::comm
