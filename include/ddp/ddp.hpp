#pragma once
// libddp's public entry points: what a training program calls. Everything here is also reachable
// under its layer's namespace; the short names below are the ones the docs use. Include the
// narrower headers to build faster.
//
//   start       ddp::init_process_group(), ddp::DeviceMesh(pg, {2, 2}, {"dp", "tp"}),
//               ddp::submesh(mesh, {"replicate", "shard"}), ddp::node_mesh(pg) (shard within a
//               node, replicate across nodes), ddp::world_info_from_env (torchrun / ddp-run /
//               mpirun / srun variables)
//   wrap        ddp::data_parallel(module, group or mesh, style) -> ddp::DataParallel, or the
//               style's wrapper itself: ddp::DistributedDataParallel (replicate),
//               ddp::FullyShardedDataParallel (fully_shard, default)
//   split       ddp::parallelize_module(module, mesh["tp"], {{"fc1", ddp::ColwiseParallel()}})
//   in a model  ddp::call_unit(*block, x) (a unit's or a planned module's forward; ddp::run_unit
//               for any function), ddp::activation_checkpoint
//   data        ddp::DistributedSampler, ddp::LoaderSampler
//   checkpoints ddp::save_and_barrier, ddp::resume_latest over an io::TrainingState;
//               ddp::AsyncCheckpointer (written while training goes on)
//   export      ddp::whole_state(module, model.sharding()) (every style and mesh),
//   ddp::save_weights recipe      ddp::Sgd, ddp::Adam, ddp::AdamW (one per algorithm, eager and
//   captured: rate and
//               step count on the device), ddp::weight_decay_groups (AdamW's groups), ddp::lr_at
//               and ddp::LrDecay (warmup, cosine), ddp::set_lr, ddp::clip_grad_norm(model[, tp],
//               max_norm) over any style and mesh, ddp::GradClipper (the norm and skip on the
//               device), ddp::StepRng (dropout per step)
//   captured    ddp::CapturedStep (a whole step as one CUDA graph)
//
// The public headers are every header under include/ddp but the internal ones listed in
// DDP_INTERNAL_HEADERS (CMakeLists.txt: the gradient runtime, the autograd plumbing, the graph
// walker, the sharded runtime's flat groups and schedule, comm's collective helpers, io's file
// formats, detail/). No public header includes an internal one (a test preprocesses this header
// and each public one without them); an install puts them apart, under include/ddp-internal, and
// they may change without notice (docs/api.md draws the line).

#include "ddp/comm/device_mesh.hpp"
#include "ddp/comm/env.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/comm/metric_reduction.hpp"
#include "ddp/comm/node_layout.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/comm/recorder/flight_recorder.hpp"
#include "ddp/comm/submesh.hpp"
#include "ddp/data/distributed_sampler.hpp"
#include "ddp/data/loader_sampler.hpp"
#include "ddp/graphs/captured_step.hpp"
#include "ddp/graphs/step_rng.hpp"
#include "ddp/io/async_checkpointer.hpp"
#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/io/full_state_dict.hpp"
#include "ddp/io/torch_save.hpp"
#include "ddp/nn/sync_batch_norm.hpp"
#include "ddp/optim/adam.hpp"
#include "ddp/optim/grad_clip.hpp"
#include "ddp/optim/lr_schedule.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/parallel/grad_clip.hpp"
#include "ddp/parallel/memory_estimate.hpp"
#include "ddp/shard/deferred_init.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "ddp/tp/parallelize.hpp"
#include "ddp/unit/activation_checkpoint.hpp"
#include "ddp/unit/call_unit.hpp"
#include "ddp/unit/unit_scope.hpp"

namespace ddp {
using comm::DeviceMesh;
using comm::dump_flight_recorder;
using comm::FlightRecorderOptions;
using comm::init_process_group;
using comm::InitOptions;
using comm::MetricTotal;
using comm::node_count;
using comm::node_mesh;
using comm::note_step;
using comm::ProcessGroupPtr;
using comm::reduce_metric;
using comm::submesh;
using comm::world_info_from_env;
using data::DistributedSampler;
using data::LoaderSampler;
using data::SamplerOptions;
using graphs::CapturedStep;
using graphs::CapturedStepOptions;
using graphs::StepRng;
using io::AsyncCheckpointer;
using io::AsyncCheckpointerOptions;
using io::CoordinatorOptions;
using io::resume_latest;
using io::save_and_barrier;
using io::save_weights;
using io::TensorMap;
using io::TrainingState;
using io::whole_state;
using optim::Adam;
using optim::AdamW;
using optim::ClipOptions;
using optim::GradClipper;
using optim::lr_at;
using optim::LrDecay;
using optim::LrScheduleOptions;
using optim::set_lr;
using optim::Sgd;
using optim::weight_decay_groups;
using shard::FullyShardedDataParallel;
using shard::ShardOptions;
using tp::ColwiseParallel;
using tp::parallelize_module;
using tp::RowwiseParallel;
using tp::TpPlan;
using unit::run_unit;
}  // namespace ddp
