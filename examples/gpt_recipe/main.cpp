// gpt_recipe: nanoGPT's training recipe in C++ with libddp. A small byte-level GPT learns a text
// file (default: the GPL, on every Debian system) with
//   - AdamW, weight decay on the weight matrices and embeddings only
//   (ddp::optim::weight_decay_groups)
//   - linear warmup, then cosine decay to a floor (ddp::optim::lr_at, a pure function of the step)
//   - gradient-norm clipping over every rank's shards (ddp::clip_grad_norm)
//   - gradient accumulation: no_sync for all micro-batches but the last
//   - any data-parallel style: --style replicate (DDP), fully_shard or default (FSDP-like)
// Each step's windows are a function of the step (a seeded draw of the global batch, this rank
// taking its slice), so the run equals one process training on the global batch.
//
// Build against an installed libddp (cmake --install build --prefix <prefix>):
//   cmake -S examples/gpt_recipe -B /tmp/gpt_recipe -DCMAKE_PREFIX_PATH=<prefix>
//   cmake --build /tmp/gpt_recipe
// Run at world 2:
//   <prefix>/bin/ddp-run --nproc-per-node 2 -- /tmp/gpt_recipe/gpt_recipe --steps 200
// Flags: --steps N, --style S, --file PATH, --grad-accum N.

#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "ddp/comm/init.hpp"
#include "ddp/optim/lr_schedule.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "ddp/parallel/grad_clip.hpp"

constexpr int64_t kVocab = 256, kSeq = 32, kDim = 64, kHeads = 4;

// Pre-LN transformer block: causal self-attention, then an MLP. A FULLY_SHARD unit (run_unit).
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : ln_1(register_module("ln_1", torch::nn::LayerNorm(std::vector<int64_t>{kDim}))),
        c_attn(register_module("c_attn", torch::nn::Linear(kDim, 3 * kDim))),
        c_proj(register_module("c_proj", torch::nn::Linear(kDim, kDim))),
        ln_2(register_module("ln_2", torch::nn::LayerNorm(std::vector<int64_t>{kDim}))),
        c_fc(register_module("c_fc", torch::nn::Linear(kDim, 4 * kDim))),
        mlp_proj(register_module("mlp_proj", torch::nn::Linear(4 * kDim, kDim))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), hd = kDim / kHeads;
    const auto heads = [&](const torch::Tensor& u) {
      return u.view({b, t, kHeads, hd}).transpose(1, 2);  // [B, H, T, hd]
    };
    const auto qkv = c_attn(ln_1(x)).split(kDim, 2);
    const auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    const auto future = torch::ones({t, t}, x.options().dtype(torch::kBool)).triu(1);
    const auto att = (q.matmul(k.transpose(-2, -1)) / std::sqrt(double(hd)))
                         .masked_fill(future, -INFINITY)
                         .softmax(-1);
    const auto y = att.matmul(v).transpose(1, 2).reshape({b, t, kDim});
    const auto h = x + c_proj(y);
    return h + mlp_proj(torch::gelu(c_fc(ln_2(h))));
  }
  torch::nn::LayerNorm ln_1;
  torch::nn::Linear c_attn, c_proj;
  torch::nn::LayerNorm ln_2;
  torch::nn::Linear c_fc, mlp_proj;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  GptImpl() {
    wte = register_module("wte", torch::nn::Embedding(kVocab, kDim));
    wpe = register_module("wpe", torch::nn::Embedding(kSeq, kDim));
    h = register_module("h", torch::nn::ModuleList(Block(), Block()));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(std::vector<int64_t>{kDim}));
    lm_head = register_module("lm_head", torch::nn::Linear(kDim, kVocab));
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    auto x = wte(idx) + wpe(torch::arange(idx.size(1)));
    for (const auto& block : *h) {
      // run_unit marks a unit's forward: the sharded styles gather its parameters around it.
      x = ddp::unit::run_unit(
          *block, [&](const torch::Tensor& in) { return block->as<BlockImpl>()->forward(in); }, x);
    }
    return lm_head(ln_f(x));
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(Gpt);

int run(int argc, char** argv) {
  int64_t steps = 200, micro = 2, batch = 8;  // batch: windows per rank and micro-batch
  std::string style = "replicate", file = "/usr/share/common-licenses/GPL-3";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--grad-accum")) micro = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--style")) style = argv[i + 1];
    if (!std::strcmp(argv[i], "--file")) file = argv[i + 1];
  }
  at::set_num_threads(1);
  auto pg = ddp::comm::init_process_group();
  std::ifstream in(file, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  TORCH_CHECK(text.size() > kSeq + 1, "gpt_recipe: cannot read ", file);
  const auto bytes =
      torch::from_blob(const_cast<char*>(text.data()), {int64_t(text.size())}, torch::kUInt8)
          .to(torch::kLong);

  torch::manual_seed(0);  // the same initial model on every rank (rank 0's is broadcast anyway)
  Gpt gpt;
  ddp::DataParallelOptions options;
  options.shard.units = {"h.0", "h.1"};  // each block a unit under the sharded styles
  auto model = ddp::data_parallel(gpt, pg, ddp::shard::parse_style(style), options);

  // AdamW as nanoGPT configures it, built after wrapping (it sees the shards).
  torch::optim::AdamW opt(ddp::optim::weight_decay_groups(
      gpt->parameters(), torch::optim::AdamWOptions(3e-3).betas({0.9, 0.99}).weight_decay(0.1)));
  ddp::optim::LrScheduleOptions schedule;  // warmup 10 steps, cosine to lr / 10 at the end
  schedule.lr = 3e-3;
  schedule.min_lr = 3e-4;
  schedule.warmup_steps = std::min<int64_t>(10, steps);
  schedule.decay_steps = steps;

  // Step s's global batch: world * micro * batch windows drawn with seed s; this rank's part.
  const int64_t world = pg->world_size(), per_step = world * micro * batch;
  const auto windows = [&](int64_t step, int64_t k) {
    torch::manual_seed(1000 + step);
    const auto starts = torch::randint(int64_t(text.size()) - kSeq - 1, {per_step});
    const auto mine = starts.narrow(0, (pg->rank() * micro + k) * batch, batch);
    const auto at = mine.unsqueeze(1) + torch::arange(kSeq + 1).unsqueeze(0);
    const auto w = bytes.index_select(0, at.flatten()).view({batch, kSeq + 1});
    return std::make_pair(w.narrow(1, 0, kSeq), w.narrow(1, 1, kSeq));
  };
  const auto micro_loss = [&](int64_t step, int64_t k) {
    const auto [x, y] = windows(step, k);
    return torch::nn::functional::cross_entropy(model(x).reshape({-1, kVocab}), y.reshape(-1));
  };

  double first = 0, last = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const double lr = ddp::optim::lr_at(schedule, step);
    ddp::optim::set_lr(opt, lr);
    opt.zero_grad();
    double loss = 0;
    for (int64_t k = 0; k < micro; ++k) {
      // All micro-batches but the last accumulate locally; the last one's backward reduces the
      // sum. Each loss is divided by `micro`: the gradient of the mean over the step's windows.
      torch::Tensor l;
      if (k + 1 < micro) {
        auto quiet = model.no_sync();
        l = micro_loss(step, k);
        (l / micro).backward();
      } else {
        l = micro_loss(step, k);
        (l / micro).backward();
      }
      loss += l.item<double>() / micro;
    }
    const auto clipped = ddp::clip_grad_norm(model, 1.0);  // the whole model's norm, every style
    opt.step();
    if (step == 0) first = loss;
    last = loss;
    if (pg->rank() == 0 && (step % 20 == 0 || step + 1 == steps)) {
      std::printf("step %lld loss %.4f lr %.2e grad norm %.3f\n", static_cast<long long>(step),
                  loss, lr, clipped.norm());  // norm(): the host's copy (a tensor is not a %f)
    }
  }
  // Rank r's loss is on its own windows; the mean over ranks is the step's loss.
  auto mean = torch::tensor({last});
  pg->allreduce_sum(mean, "final loss");
  std::printf("rank %d: world size %lld, style %s, first loss %.6f, final loss %.9g\n", pg->rank(),
              static_cast<long long>(world), style.c_str(), first, mean.item<double>() / world);
  pg->barrier("end");
  return 0;
}

// A library error (a bad flag, a rank that died, a refused checkpoint) as one line, not a
// backtrace per rank.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "gpt_recipe: %s\n", e.what_without_backtrace());
    return 1;
  }
}
