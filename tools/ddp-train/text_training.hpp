#pragma once
// ddp-train --data [FILE]: a GPT of the zoo trained on the bytes of a text file (models::ByteText)
// instead of a synthetic task. What this adds to the training loop of main.cpp:
//
//   data        each rank draws its batch of training windows from its own
//               data::DistributedSampler over the window starts (a new shuffle every epoch);
//               checkpoints keep the sampler's data_position, and a resume at any number of
//               data ranks (same global batch) continues at that window
//   validation  every --eval-every steps and at the last one, the mean loss over the fixed
//               validation windows, split across the data ranks and all-reduced
//   sample      at the end, --sample-bytes bytes the model writes after a prompt from the
//               validation text, printed by rank 0
//
// With no FILE it reads kDefaultText, which every Debian and Ubuntu system has (base-files), so
// the README's main job needs no download.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ddp/comm/process_group.hpp"
#include "ddp/data/distributed_sampler.hpp"
#include "ddp/models/byte_text.hpp"
#include "ddp/models/registry.hpp"
#include "loss_plot.hpp"
#include "progress.hpp"
#include "text_sample.hpp"

namespace ddp::tools {

// The GNU GPL version 3 (35 KB of English): on every Debian system, in base-files.
constexpr const char* kDefaultText = "/usr/share/common-licenses/GPL-3";

struct TextFlags {
  bool data = false;      // --data was given
  std::string data_file;  // its value; "" takes kDefaultText
  // --eval-every N, default 25: 24 validation points on a 600-step run, each about as costly as
  // one training step's forward.
  int eval_every = 25;
  // --sample-bytes N, default SampleOptions::bytes; 0 prints no sample.
  int64_t sample_bytes = SampleOptions{}.bytes;
  // --drop-last, default off (PyTorch's DataLoader default): each epoch's partial last batch is
  // skipped. --cuda-graph turns it on, since a graph replays one batch shape.
  bool drop_last = false;
  std::string path() const { return data_file.empty() ? kDefaultText : data_file; }
};

// --data [FILE], --eval-every N, --sample-bytes N, --drop-last.
void add_text_flags(CLI::App& app, TextFlags& flags);

// After parsing, before the other flag checks. With --data: --model defaults to "gpt" and
// --optimizer to "adam" unless given, and the model must be a GPT. Without --data, --eval-every
// and --sample-bytes are refused. Returns the complaint, "" when all is well.
std::string check_text_flags(const CLI::App& app, TextFlags& flags, std::string& model,
                             std::string& optimizer);

// Before any worker starts, with --data: the file must hold a training and a validation sequence
// of the model's length (its seq_len; the model is built once here to learn it). Throws
// c10::Error with ByteText's message naming the file and the problem.
void check_text_file(const TextFlags& flags, const std::string& model,
                     const models::WorkloadOptions& workload);

// --plot FILE.svg: the complaint about a path the plot cannot be written to ("" when it can): the
// directory is missing, is not a directory or is not writable, or FILE is not writable.
std::string check_plot_path(const std::string& path);

class TextTraining {
 public:
  // `w` must be a GPT workload (its seq_len is the window length); `dp_group` and `data_rank` are
  // the data-parallel group and this rank's place in it (with --tp, the ranks of one tp group
  // share a data rank and train on the same windows). `seed` seeds the samplers' shuffles and the
  // text sample. `lead`: this rank prints (global rank 0).
  TextTraining(const TextFlags& flags, const models::Workload& w, comm::ProcessGroupPtr dp_group,
               int data_rank, int64_t batch_size, uint64_t seed, torch::Device device, bool lead);

  const models::ByteText& text() const { return text_; }

  // This rank's next batch of training windows (x, y: int64 [n, seq_len], on the CPU); n is the
  // batch size, or less for the last batch of an epoch, after which the next epoch starts.
  std::pair<torch::Tensor, torch::Tensor> next_batch();
  // From now on an epoch's last, partial batch is dropped (PyTorch's drop_last) and the next epoch
  // starts instead, said once by the lead rank with `why` (--drop-last, or a captured step, which
  // replays one batch shape).
  void drop_partial_batches(std::string why) {
    drop_partial_ = true;
    drop_reason_ = std::move(why);
  }
  // Tokens all data ranks train on in one full step: batch size * seq_len * data ranks.
  int64_t tokens_per_step() const;

  // The position a checkpoint keeps as TrainingState::data_position, and where a resume
  // continues: DistributedSampler::data_position, which any number of data ranks can resume (with
  // the same global batch).
  int64_t data_position() const;
  void seek(int64_t data_position);

  // The mean cross entropy per byte over every validation window, the same on every rank.
  // Collective over the data-parallel group (one all-reduce), and every rank runs the same number
  // of forwards, so it also works where forward is collective (sharded styles, --tp).
  double validation_loss(const TokenForward& forward) const;
  // Whether after_step evaluates after `step`: every flags.eval_every steps and at the last.
  bool evaluates_at(int step, int last_step) const {
    return step % flags_.eval_every == 0 || step == last_step;
  }
  // After step `step` of a run ending at `last_step`: every flags.eval_every steps and at the
  // last step, computes the validation loss (collective), records it in `curve` and prints it
  // through `progress` on the lead rank. Returns it when computed.
  std::optional<double> after_step(int step, int last_step, double train_loss,
                                   const TokenForward& forward, LossCurve& curve,
                                   Progress& progress);

  // The prompt: the start of a line of the validation text, at most half a window long.
  std::string prompt() const;
  // What rank 0 prints at the end: a heading line, then the prompt and the flags.sample_bytes
  // bytes the model writes after it (sample_text), escaped (printable); "" when sample_bytes is 0.
  // Every rank must call it: the forwards are collective under the sharded styles and --tp.
  std::string sample_report(const TokenForward& forward) const;

  // Title, subtitle and the unigram-entropy reference line for --plot.
  LossPlotOptions plot_options(const std::string& model, int world_size) const;

 private:
  TextFlags flags_;
  models::ByteText text_;
  comm::ProcessGroupPtr dp_group_;
  int data_rank_;
  int64_t batch_size_;
  uint64_t seed_;
  torch::Device device_;
  bool lead_;
  data::DistributedSampler sampler_;
  bool drop_partial_ = false;   // drop_partial_batches() was called
  std::string drop_reason_;     // its `why`, for the one line that says so
  bool said_dropping_ = false;  // the lead rank has said that it drops them
};

}  // namespace ddp::tools
