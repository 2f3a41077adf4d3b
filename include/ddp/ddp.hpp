#pragma once
// libddp: everything a training program needs. Include narrower headers to build faster.

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/buckets/bucket_table.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/data/distributed_sampler.hpp"
#include "ddp/data/loader_sampler.hpp"
#include "ddp/launch/spawn.hpp"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/reducer/reducer_runtime.hpp"
