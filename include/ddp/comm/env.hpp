#pragma once
// Where a worker learns its place in the job: the torchrun convention of environment variables.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace ddp::comm {

// A worker's place in the job, as read from the environment.
struct WorldInfo {
  int rank = 0;                  // RANK: 0..world_size-1
  int world_size = 1;            // WORLD_SIZE: >= 1
  int local_rank = 0;            // LOCAL_RANK: index on this host (selects the GPU); 0 if unset
  std::string master_addr;       // MASTER_ADDR: host of rank 0's store
  uint16_t master_port = 29500;  // MASTER_PORT: port of rank 0's store, 1..65535
  // Whose variables gave rank and world size: "torchrun" (RANK, WORLD_SIZE; also ddp-run and
  // ddp-train --nproc), "openmpi" (OMPI_COMM_WORLD_*) or "slurm" (SLURM_PROCID, SLURM_NTASKS).
  std::string launcher = "torchrun";
};

// Looks a variable up; returns nullopt when it is unset. Injected so that parsing is a pure,
// unit-testable function of a map.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment.
EnvLookup process_env();

// The launcher whose variables give this process its rank: "torchrun" when RANK is set (torchrun,
// ddp-run, ddp-train --nproc, or a user by hand), else "openmpi" when OMPI_COMM_WORLD_RANK is set
// (mpirun), else "slurm" when SLURM_PROCID is set (srun); nullopt when none is. A tool asks this
// to decide between running as one worker and spawning its own, so that it agrees with
// world_info_from_env, which reads the variables of the launcher named here.
std::optional<std::string> launcher_from_env(const EnvLookup& env);

// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. RANK, WORLD_SIZE and MASTER_PORT
// are required; a missing or malformed one is an error that names the variable and what it expects.
// Without RANK, mpirun's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK or srun's SLURM_PROCID /
// SLURM_NTASKS / SLURM_LOCALID give rank, world size and local rank (in that order of preference);
// MASTER_ADDR and MASTER_PORT still come from the environment (mpirun -x, or the job script).
WorldInfo world_info_from_env(const EnvLookup& env);

}  // namespace ddp::comm
