#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "ddp/files/posix_file.hpp"
#include "ddp/io/safetensors.hpp"
#include "support/run_command.hpp"

namespace {

using ddp::testing::read_file;
using ddp::testing::run_command;

const std::string kBench = DDP_BENCH_PATH;

std::string temp_dir(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() /
             ("ddp-bench-test-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

// ddp-bench with `args` exits 2 having printed `text`: a flag refused before any worker starts.
void expect_refused(const std::string& args, const std::string& text) {
  const auto [out, code] = run_command(kBench + " " + args);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find(text), std::string::npos) << out;
}

TEST(DdpBench, PrintsTheResultAndTheSeedsLastLine) {
  const auto [out, code] = run_command(
      kBench + " --ddp --nproc 2 --model mlp-deep --batch-size 8 --repeat 3 --warmup 1");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("result model=mlp-deep world=2 batch=8 device=cpu side=ours median_ms="),
            std::string::npos)
      << out;
  double mean = 0;
  int runs = 0;
  const auto pos = out.find("mean latency ");
  ASSERT_NE(pos, std::string::npos) << out;
  ASSERT_EQ(std::sscanf(out.c_str() + pos, "mean latency %lf ms across %d runs", &mean, &runs), 2);
  EXPECT_EQ(runs, 3);
  EXPECT_GT(mean, 0);
}

TEST(DdpBench, JsonModeAndWorldOneBaseline) {
  const auto [out, code] =
      run_command(kBench + " --model mlp-deep --batch-size 8 --repeat 2 --warmup 0 --json");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("{\"model\":\"mlp-deep\",\"world\":1,\"batch\":8,\"device\":\"cpu\","
                     "\"side\":\"ours\",\"median_ms\":"),
            std::string::npos)
      << out;
}

// A captured step needs the GPU: refused before any worker starts, naming the device.
TEST(DdpBench, CudaGraphOnCpuIsRefused) {
  expect_refused("--ddp --cuda-graph --model toy",
                 "ddp-bench: --cuda-graph needs --device cuda, not --device cpu: CUDA graphs "
                 "capture GPU work only");
}

// A kernel trace is Kineto's view of the device: refused on the CPU by name, before any step.
TEST(DdpBench, KernelTraceOnCpuIsRefused) {
  const auto [out, code] =
      run_command(kBench + " --model toy --repeat 1 --warmup 0 --kernel-trace /nonexistent/t.json");
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("ddp-bench: --kernel-trace needs --device cuda and a CUDA build of libtorch "
                     "(torch's Kineto profiler traces the device's kernels)"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("median_ms"), std::string::npos) << out;
}

// NCCL's communicator options are checked at parse time, by range; a build without NCCL has no
// such flags.
TEST(DdpBench, NcclOptionsOutOfRangeAreRefused) {
  const auto [out, code] = run_command(kBench + " --model toy --nccl-cta-policy 5");
  EXPECT_EQ(code, 2);
  const auto [out2, code2] = run_command(kBench + " --model toy --nccl-max-ctas 65");
  EXPECT_EQ(code2, 2);
#if defined(DDP_WITH_NCCL) && DDP_WITH_NCCL
  EXPECT_NE(out.find("--nccl-cta-policy: Value 5 not in range -1 to 2"), std::string::npos) << out;
  EXPECT_NE(out2.find("--nccl-max-ctas: Value 65 not in range -1 to 64"), std::string::npos)
      << out2;
#else
  EXPECT_EQ(out, "ddp-bench: unknown flag --nccl-cta-policy; see --help\n");
  EXPECT_EQ(out2, "ddp-bench: unknown flag --nccl-max-ctas; see --help\n");
#endif
}

// find_unused_parameters reads its map on the host every step unless the graph is static.
TEST(DdpBench, CudaGraphWithFindUnusedNeedsStaticGraph) {
  const auto [out, code] =
      run_command(kBench + " --ddp --device cuda --cuda-graph --find-unused-parameters");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("ddp-bench: --cuda-graph cannot be combined with --find-unused-parameters "
                     "without --static-graph (the used-parameter map is read on the host every "
                     "step)"),
            std::string::npos)
      << out;
}

// Refused before any worker starts, naming the flag, the model and the models it fits.
TEST(DdpBench, TieWeightsNeedsAGptModel) {
  const auto [out, code] = run_command(kBench + " --ddp --nproc 2 --model mlp-deep --tie-weights");
  EXPECT_EQ(code, 2);
  EXPECT_NE(
      out.find("ddp-bench: --tie-weights needs a GPT model (gpt, gpt-tiny, gpt2-small, "
               "gpt2-medium, gpt-char), got --model mlp-deep, which has no token embedding to tie"),
      std::string::npos)
      << out;
}

TEST(DdpBench, SyncBnNeedsAModelWithBatchNorm) {
  const auto [out, code] = run_command(kBench + " --ddp --nproc 2 --model toy --sync-bn");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("ddp-bench: --sync-bn needs a model with BatchNorm (resnet-small), got "
                     "--model toy"),
            std::string::npos)
      << out;
}

TEST(DdpBench, ProfileWritesOneTrackPerRankWithComputeAndBucketSpans) {
  const std::string dir = temp_dir("profile");
  const std::string trace = dir + "/trace.json", dot = dir + "/graph.dot";
  const auto [out, code] =
      run_command(kBench +
                  " --ddp --nproc 2 --model mlp-deep --batch-size 4 --repeat 2 --warmup 0 "
                  "--bucket-cap-mb 1 --profile --trace-file " +
                  trace + " --graph-dot " + dot);
  ASSERT_EQ(code, 0) << out;
  const std::string text = read_file(trace);
  for (const char* part :
       {"\"traceEvents\"", "\"name\":\"rank 0\"", "\"name\":\"rank 1\"", "\"name\":\"forward\"",
        "\"name\":\"backward\"", "\"name\":\"optimizer\"", "\"name\":\"bucket 0\"",
        "\"name\":\"bucket 3\"", "\"cat\":\"comm\"", "\"pid\":1"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part;
  }
  const std::string graph = read_file(dot);
  EXPECT_EQ(graph.rfind("digraph autograd {", 0), 0u) << graph.substr(0, 200);
  EXPECT_NE(graph.find("layers.15.weight"), std::string::npos);
  EXPECT_NE(graph.find("AddmmBackward"), std::string::npos);
  ddp::files::remove_tree(dir);
}

// Parity mode against the single-process path of the same tool: `world` ranks on slices of a
// batch with plain SGD end where one process on the whole batch ends, for DDP and the sharded
// styles (mlp-deep's 512 rows split unevenly at world 3).
// `world` ranks of `data_ranks` (world / tp with --tp) data-parallel groups.
void expect_parity(const std::string& style_flags, int world, const std::string& model = "mlp-deep",
                   int64_t width = 512, size_t tensors = 32, int data_ranks = 0) {
  if (data_ranks == 0) data_ranks = world;
  const std::string dir = temp_dir("parity");
  torch::manual_seed(3);
  ddp::io::TensorMap inputs, whole;
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({4 * data_ranks, width});
    auto y = torch::randn({4 * data_ranks, width});
    for (int r = 0; r < data_ranks; ++r) {
      inputs["x." + std::to_string(step) + "." + std::to_string(r)] = x.narrow(0, 4 * r, 4);
      inputs["y." + std::to_string(step) + "." + std::to_string(r)] = y.narrow(0, 4 * r, 4);
    }
    whole["x." + std::to_string(step) + ".0"] = x;
    whole["y." + std::to_string(step) + ".0"] = y;
  }
  ddp::io::save_safetensors(dir + "/inputs.safetensors", inputs);
  ddp::io::save_safetensors(dir + "/whole.safetensors", whole);
  const std::string common = kBench + " --model " + model + " --lr 0.05 ";
  auto [out1, code1] =
      run_command(common + style_flags + " --nproc " + std::to_string(world) + " --inputs " + dir +
                  "/inputs.safetensors --save-params " + dir + "/dp.safetensors");
  ASSERT_EQ(code1, 0) << out1;
  auto [out2, code2] =
      run_command(common + "--inputs " + dir + "/whole.safetensors --save-params " + dir +
                  "/single.safetensors");
  ASSERT_EQ(code2, 0) << out2;
  const auto a = ddp::io::load_safetensors(dir + "/dp.safetensors");
  const auto b = ddp::io::load_safetensors(dir + "/single.safetensors");
  ASSERT_EQ(a.size(), tensors);
  for (const auto& [name, t] : b) {
    ASSERT_EQ(a.at(name).sizes(), t.sizes()) << name;
    const double rel = (a.at(name) - t).norm().item<double>() / t.norm().item<double>();
    EXPECT_LT(rel, 1e-5) << style_flags << ": " << name;
  }
  ddp::files::remove_tree(dir);
}

TEST(DdpBench, ParityModeMatchesTheSingleProcessRun) { expect_parity("--ddp", 2); }
// --tp 2 at world 4: the seed Net split over "tp", DDP over "dp" (2 data ranks); --save-params
// makes the shards whole.
TEST(DdpBench, TensorParallelWithDdpParityAtWorldFour) {
  expect_parity("--ddp --tp 2", 4, "toy", 2000, 8, 2);
}
TEST(DdpBench, TensorParallelNeedsADataParallelStyleAndAPlan) {
  auto [out, code] = run_command(kBench + " --model toy --nproc 4 --tp 2 --repeat 1 --warmup 0");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("ddp-bench: --tp 2 at world size 4 leaves 2 data-parallel ranks: add --ddp "
                     "or a sharded --style"),
            std::string::npos)
      << out;
  std::tie(out, code) = run_command(kBench + " --model mlp --nproc 2 --tp 2 --repeat 1");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("ddp-bench: --tp: model mlp has no tensor-parallel plan (net, toy, toy8k, "
                     "the GPTs and the Llamas have one)"),
            std::string::npos)
      << out;
}
TEST(DdpBench, FullyShardedParityAtWorldThree) { expect_parity("--fsdp", 3); }
TEST(DdpBench, DefaultStyleParityAtWorldTwo) { expect_parity("--style default", 2); }
TEST(DdpBench, FullyShardedPerLayerWithoutPrefetchParityAtWorldThree) {
  expect_parity("--fsdp --fsdp-wrap --prefetch false", 3);
}

// --fsdp-checkpoint recomputes every layer's activations in backward: the same end, under DDP and
// under FULLY_SHARD per layer (where each unit is gathered again before its recompute).
TEST(DdpBench, ActivationCheckpointingParityUnderDdpAndFullyShard) {
  expect_parity("--ddp --fsdp-checkpoint", 3);
  expect_parity("--fsdp --fsdp-wrap --fsdp-checkpoint", 2);
}

TEST(DdpBench, UnitFlagsNeedAShardedStyle) {
  const auto [out, code] = run_command(kBench + " --ddp --fsdp-wrap --model toy");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("ddp-bench: --fsdp-wrap, --reshard-after-forward, --prefetch, --param-dtype, "
                     "--reduce-dtype and --dp-replicate need --fsdp or a sharded --style"),
            std::string::npos)
      << out;
}

TEST(DdpBench, LocalInitNeedsAShardedStyleBuiltShardByShard) {
  const auto [out, code] = run_command(kBench + " --ddp --local-init --model toy");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("ddp-bench: --local-init needs --fsdp or a sharded --style: it initialises "
                     "this rank's shards"),
            std::string::npos)
      << out;
  const auto [tp_out, tp_code] =
      run_command(kBench + " --fsdp --local-init --tp 2 --nproc 2 --model net --repeat 1");
  EXPECT_NE(tp_code, 0);
  EXPECT_NE(tp_out.find("ddp-bench: --local-init initialises shards as the model is built, which "
                        "--tp and --init-params do not (they start from whole parameters)"),
            std::string::npos)
      << tp_out;
}

// --json reports each rank's initialisation (issue 60): seconds from the worker's start to the
// wrapped model, and the process's resident high-water mark then, which holds at least the whole
// model under DDP (toy: four 2000 x 2000 fp32 weights, 64 MB).
TEST(DdpBench, JsonReportsEachRanksInitialisation) {
  const auto [out, code] = run_command(
      kBench + " --model toy --nproc 2 --batch-size 4 --repeat 1 --warmup 0 --json --ddp");
  ASSERT_EQ(code, 0) << out;
  const auto list_of = [&out = out](const std::string& key) {
    const size_t at = out.find("\"" + key + "\":[");
    EXPECT_NE(at, std::string::npos) << out;
    std::vector<double> values;
    std::stringstream in(out.substr(at + key.size() + 4));
    for (double v; in >> v;) {
      values.push_back(v);
      if (in.peek() != ',') break;
      in.ignore();
    }
    return values;
  };
  const auto seconds = list_of("init_s"), peaks = list_of("init_peak_bytes");
  ASSERT_EQ(seconds.size(), 2u) << out;
  ASSERT_EQ(peaks.size(), 2u) << out;
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(seconds[r], 0) << "rank " << r;
    EXPECT_LT(seconds[r], 120) << "rank " << r;
    EXPECT_GE(peaks[r], 4 * 2000.0 * 2000 * 4) << "rank " << r;
  }
}

// --json gives the bytes a rank sent per step on each group (ProcessGroup::bytes_sent, ring
// counts): the mlp (16,640 fp32 parameters, 66,560 bytes) under DDP at world 2 all-reduces one
// bucket, 2 (n - 1) / n * 66,560; under --fsdp --dp-replicate 2 at world 4 (2 replicas of 2 shards,
// the root one unit, gathered once a step) the shard group all-gathers the whole (1/2 * 66,560)
// and reduce-scatters it (Gloo emulates it by an all-reduce: 66,560), and the replicate group
// all-reduces this rank's half (2 * 1/2 * 33,280): the cross-replica bytes are the shard's.
TEST(DdpBench, JsonReportsTheBytesEachGroupSentPerStep) {
  const std::string common =
      kBench + " --model mlp --batch-size 4 --repeat 2 --warmup 1 --json --nproc ";
  const auto [ddp, ddp_code] = run_command(common + "2 --ddp");
  ASSERT_EQ(ddp_code, 0) << ddp;
  EXPECT_NE(ddp.find("\"bytes_per_step\":{\"world\":66560}"), std::string::npos) << ddp;
  const auto [hybrid, code] = run_command(common + "4 --fsdp --dp-replicate 2");
  ASSERT_EQ(code, 0) << hybrid;
  EXPECT_NE(hybrid.find("\"bytes_per_step\":{\"world\":0,\"replicate\":33280,\"shard\":99840}"),
            std::string::npos)
      << hybrid;
}

// --json gives the memory plan made before the first step (parallel/memory_estimate.hpp): under
// fully_shard at world 2 its parameter and gradient bytes are the ones the run then holds, and
// replicate's are twice them (mlp's 64 rows divide evenly).
TEST(DdpBench, JsonGivesTheMemoryPlanMadeBeforeTheFirstStep) {
  const auto [out, code] = run_command(
      kBench + " --model mlp --nproc 2 --batch-size 4 --repeat 1 --warmup 0 --json --fsdp");
  ASSERT_EQ(code, 0) << out;
  const auto value_after = [&out = out](const std::string& from, const std::string& key) {
    const size_t at = out.find(from);
    EXPECT_NE(at, std::string::npos) << out;
    const size_t k = out.find("\"" + key + "\":", at);
    EXPECT_NE(k, std::string::npos) << out;
    return std::stoll(out.substr(k + key.size() + 3));
  };
  const long long held = value_after("\"memory\":", "param_bytes");
  EXPECT_GT(held, 0);
  EXPECT_EQ(value_after("\"fully_shard\":", "param_bytes"), held) << out;
  EXPECT_EQ(value_after("\"fully_shard\":", "grad_bytes"),
            value_after("\"memory\":", "grad_bytes"));
  EXPECT_EQ(value_after("\"replicate\":", "param_bytes"), 2 * held) << out;
  EXPECT_EQ(value_after("\"replicate\":", "gathered_bytes"), 0) << out;
}

// --json reports the bytes a rank holds: at world 2 the sharded parameters and gradients are half
// of DDP's (mlp's 64 rows divide evenly), the gathered peak is counted by owner, and the step's
// memory by phase.
TEST(DdpBench, JsonReportsMemoryPerRank) {
  const std::string common = kBench + " --model mlp --nproc 2 --batch-size 4 --repeat 2 --json ";
  const auto memory_of = [](const std::string& out) {
    const size_t at = out.find("\"memory\":");
    EXPECT_NE(at, std::string::npos) << out;
    std::map<std::string, long long> m;
    for (const char* key : {"param_bytes", "grad_bytes", "peak_gathered_bytes",
                            "device_peak_allocated_bytes", "forward_peak_bytes",
                            "backward_peak_bytes", "optimizer_peak_bytes", "between_steps_bytes",
                            "full_params_bytes", "gather_output_bytes", "reduce_input_bytes"}) {
      const size_t k = out.find(std::string("\"") + key + "\":", at);
      m[key] = k == std::string::npos ? -1 : std::stoll(out.substr(k + std::strlen(key) + 3));
    }
    return m;
  };
  const auto [ddp_out, ddp_code] = run_command(common + "--ddp");
  ASSERT_EQ(ddp_code, 0) << ddp_out;
  const auto [fsdp_out, fsdp_code] = run_command(common + "--fsdp --fsdp-wrap");
  ASSERT_EQ(fsdp_code, 0) << fsdp_out;
  auto ddp = memory_of(ddp_out), fsdp = memory_of(fsdp_out);
  EXPECT_GT(ddp["param_bytes"], 0);
  EXPECT_EQ(2 * fsdp["param_bytes"], ddp["param_bytes"]);
  EXPECT_EQ(2 * fsdp["grad_bytes"], ddp["grad_bytes"]);
  EXPECT_EQ(ddp["peak_gathered_bytes"], 0);
  EXPECT_GT(fsdp["peak_gathered_bytes"], 0);
  EXPECT_LT(fsdp["peak_gathered_bytes"], ddp["param_bytes"]);
  // By phase, from the counted CPU tensor storages: the step's peak is its largest phase's; DDP
  // holds its parameters and gradients between steps, the sharded style half of each.
  for (auto* m : {&ddp, &fsdp}) {
    auto& r = *m;
    EXPECT_GT(r["forward_peak_bytes"], 0);
    EXPECT_EQ(
        r["device_peak_allocated_bytes"],
        std::max({r["forward_peak_bytes"], r["backward_peak_bytes"], r["optimizer_peak_bytes"]}));
    EXPECT_GE(r["between_steps_bytes"], r["param_bytes"] + r["grad_bytes"]);
  }
  // (Whose backward peaks lower is the memory tests' question, on a model whose units outweigh
  // the activations: tests/shard/backward_memory_test.cpp.)
  EXPECT_LT(fsdp["between_steps_bytes"], ddp["between_steps_bytes"]);
  // By owner: DDP gathers nothing (every style reports it); the sharded style's owners each peak
  // within the total's, and together they cover it.
  for (const char* owner : {"full_params_bytes", "gather_output_bytes", "reduce_input_bytes"}) {
    EXPECT_EQ(ddp[owner], 0) << owner;
  }
  for (const char* owner : {"full_params_bytes", "gather_output_bytes", "reduce_input_bytes"}) {
    EXPECT_GT(fsdp[owner], 0) << owner;
    EXPECT_LE(fsdp[owner], fsdp["peak_gathered_bytes"]) << owner;
  }
  EXPECT_GE(fsdp["full_params_bytes"] + fsdp["gather_output_bytes"] + fsdp["reduce_input_bytes"],
            fsdp["peak_gathered_bytes"]);
}

// --param-dtype bf16 gathers bf16 copies (less gathered memory than fp32 with every unit kept
// gathered) while the shards and their gradients stay fp32; on Gloo, which cannot reduce bf16,
// the reduce dtype must be named.
TEST(DdpBench, ParamDtypeGathersBFloat16AndKeepsFp32Shards) {
  const std::string common = kBench +
                             " --model mlp --nproc 2 --batch-size 4 --repeat 2 --json --fsdp "
                             "--fsdp-wrap --reshard-after-forward false ";
  const auto memory_of = [](const std::string& out, const char* key) {
    const size_t k = out.find(std::string("\"") + key + "\":", out.find("\"memory\":"));
    return k == std::string::npos ? -1LL : std::stoll(out.substr(k + std::strlen(key) + 3));
  };
  const auto [fp32_out, fp32_code] = run_command(common);
  ASSERT_EQ(fp32_code, 0) << fp32_out;
  const auto [bf16_out, bf16_code] = run_command(common + "--param-dtype bf16 --reduce-dtype fp32");
  ASSERT_EQ(bf16_code, 0) << bf16_out;
  EXPECT_EQ(memory_of(bf16_out, "param_bytes"), memory_of(fp32_out, "param_bytes"));
  EXPECT_EQ(memory_of(bf16_out, "grad_bytes"), memory_of(fp32_out, "grad_bytes"));
  EXPECT_GT(memory_of(bf16_out, "peak_gathered_bytes"), 0);
  EXPECT_LT(memory_of(bf16_out, "peak_gathered_bytes"), memory_of(fp32_out, "peak_gathered_bytes"));
  const auto [gloo_out, gloo_code] = run_command(common + "--param-dtype bf16");
  EXPECT_NE(gloo_code, 0);
  EXPECT_NE(gloo_out.find("ddp: reduce_dtype BFloat16 (param_dtype's, the default; set "
                          "reduce_dtype to reduce in another): the gloo backend cannot reduce it"),
            std::string::npos)
      << gloo_out;
}

}  // namespace

namespace {

// The value of `key` in the JSON object that follows `from` in `out`.
long long json_number(const std::string& out, const std::string& from, const std::string& key) {
  const size_t at = out.find(from);
  EXPECT_NE(at, std::string::npos) << out;
  const size_t k = out.find("\"" + key + "\":", at);
  EXPECT_NE(k, std::string::npos) << out;
  return k == std::string::npos ? -1 : std::stoll(out.substr(k + key.size() + 3));
}

// --comm-floor replays the last timed step's collectives: under DDP the mlp's one bucket (one
// all-reduce of every parameter: the model's bytes), under fully_shard with one unit its gather
// and its reduce-scatter, each of the whole flat parameter (world x the rank's shard, padded to
// even rows at world 3).
TEST(DdpBench, CommFloorReplaysTheStepsCollectives) {
  for (const int world : {2, 3}) {
    const std::string common = kBench + " --model mlp --batch-size 4 --repeat 2 --warmup 1 " +
                               "--json --comm-floor 2 --nproc " + std::to_string(world);
    const auto [ddp_out, ddp_code] = run_command(common + " --ddp");
    ASSERT_EQ(ddp_code, 0) << ddp_out;
    const long long whole = json_number(ddp_out, "\"memory\":", "param_bytes");
    EXPECT_EQ(json_number(ddp_out, "\"comm_floor\":", "collectives"), 1) << ddp_out;
    EXPECT_EQ(json_number(ddp_out, "\"comm_floor\":", "skipped"), 0) << ddp_out;
    EXPECT_EQ(json_number(ddp_out, "\"comm_floor\":", "bytes"), whole) << ddp_out;
    const auto [fsdp_out, fsdp_code] = run_command(common + " --fsdp");
    ASSERT_EQ(fsdp_code, 0) << fsdp_out;
    EXPECT_EQ(json_number(fsdp_out, "\"comm_floor\":", "collectives"), 2) << fsdp_out;
    const long long shard = json_number(fsdp_out, "\"memory\":", "param_bytes");
    EXPECT_GE(world * shard, whole);
    EXPECT_EQ(json_number(fsdp_out, "\"comm_floor\":", "bytes"), 2 * world * shard) << fsdp_out;
  }
}

// --no-comm runs the same step with every collective a no-op: the same shards (the bytes a rank
// holds are the real run's), no loss check, and the JSON says the collectives were fake.
TEST(DdpBench, NoCommRunsTheStepOnTheSameShardsWithoutCollectives) {
  const std::string common =
      kBench + " --model mlp --nproc 2 --batch-size 4 --repeat 2 --warmup 1 --json --fsdp";
  const auto [real_out, real_code] = run_command(common);
  ASSERT_EQ(real_code, 0) << real_out;
  const auto [fake_out, fake_code] = run_command(common + " --no-comm");
  ASSERT_EQ(fake_code, 0) << fake_out;
  EXPECT_NE(fake_out.find("\"collectives\":\"fake\""), std::string::npos) << fake_out;
  EXPECT_EQ(real_out.find("\"collectives\":"), std::string::npos) << real_out;
  for (const char* key : {"param_bytes", "grad_bytes"}) {
    EXPECT_EQ(json_number(fake_out, "\"memory\":", key), json_number(real_out, "\"memory\":", key))
        << key;
  }
}

TEST(DdpBench, TheFloorsRefuseWhatTheyCannotMeasure) {
  expect_refused("--model mlp --no-comm",
                 "ddp-bench: --no-comm needs --ddp or a sharded --style (the plain model issues "
                 "no collectives)");
  expect_refused("--model mlp --nproc 2 --ddp --no-comm --comm-floor 2",
                 "ddp-bench: --no-comm and --comm-floor measure the two floors in separate runs "
                 "(with --no-comm there are no collectives to replay)");
}

}  // namespace
