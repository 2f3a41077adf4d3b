#include "text_training.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include "common/flag_parse.hpp"
#include "ddp/models/gpt.hpp"
#include "ddp/models/llama.hpp"

namespace ddp::tools {
namespace {

// The window length: the model's seq_len (the GPT's or the Llama's).
int64_t seq_len_of(const models::Workload& w) {
  if (const auto* gpt = dynamic_cast<const models::GPTImpl*>(w.ptr.get())) {
    return gpt->config().seq_len;
  }
  const auto* llama = dynamic_cast<const models::LlamaImpl*>(w.ptr.get());
  TORCH_CHECK(llama != nullptr, "--data: model ", w.name, " is neither a GPT nor a Llama");
  return llama->config().seq_len;
}

// The prompt: the validation text's first whole line (from its first line start, if one comes
// soon), at most half a window long, so that the model sees the prompt and its own bytes.
std::string prompt_from(const models::ByteText& text) {
  const std::string_view v = text.validation_text();
  const size_t newline = v.find('\n');
  const size_t start =
      newline != std::string_view::npos && newline + 1 < v.size() / 2 ? newline + 1 : 0;
  const size_t longest = size_t(std::max<int64_t>(1, text.seq_len() / 2));
  std::string_view line = v.substr(start, longest);
  // End at a line's end when one falls inside: a whole line reads better than half of one.
  if (const size_t end = line.find('\n'); end != std::string_view::npos && end > 0) {
    line = line.substr(0, end + 1);
  }
  return std::string(line);
}

}  // namespace

void add_text_flags(CLI::App& app, TextFlags& flags) {
  const FlagGroup group(app, "Text (--data)");
  app.add_option("--data", flags.data_file,
                 std::string("train a byte-level GPT on the bytes of FILE (first 90% training, "
                             "last 10% validation); with no FILE: ") +
                     kDefaultText + ". --model defaults to gpt and --optimizer to adam then")
      ->expected(0, 1)
      ->type_name("[FILE]");
  app.add_option("--eval-every", flags.eval_every,
                 "with --data: the validation loss every N steps and at the last step")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--sample-bytes", flags.sample_bytes,
                 "with --data: bytes of text the trained model writes at the end (0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_flag("--drop-last", flags.drop_last,
               "with --data: skip each epoch's partial last batch (PyTorch's drop_last); on with "
               "--cuda-graph");
}

std::string check_text_flags(const CLI::App& app, TextFlags& flags, std::string& model,
                             std::string& optimizer) {
  flags.data = app.count("--data") > 0;
  if (!flags.data) {
    for (const char* flag : {"--eval-every", "--sample-bytes", "--drop-last"}) {
      if (app.count(flag) > 0) return std::string(flag) + " needs --data";
    }
    return "";
  }
  if (app.count("--model") == 0) model = "gpt";
  if (app.count("--optimizer") == 0) optimizer = "adam";
  // The GPTs and the Llamas: the workloads of tokens (registry.hpp's shaped ones).
  const auto token_models = models::shaped_workload_names();
  if (std::find(token_models.begin(), token_models.end(), model) != token_models.end()) return "";
  std::string list;
  for (const auto& name : token_models) list += (list.empty() ? "" : ", ") + name;
  return "--data trains a GPT or a Llama on bytes, but --model " + model + " is neither; use " +
         list + " (gpt is the default with --data)";
}

void check_text_file(const TextFlags& flags, const std::string& model,
                     const models::WorkloadOptions& workload) {
  // The window length is the model's seq_len (read from the zoo's table: a Llama 3 row is
  // gigabytes to build); ByteText refuses a file too short for it.
  const models::ByteText text(flags.path(), models::workload_seq_len(model, workload));
}

std::string check_plot_path(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  const std::string where = "--plot '" + path + "': cannot write the plot there: ";
  if (!fs::exists(status)) return where + "directory '" + dir.string() + "' does not exist";
  if (!fs::is_directory(status)) return where + "'" + dir.string() + "' is not a directory";
  if (fs::is_directory(file, ec)) return where + "it is a directory";
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return where + "directory '" + dir.string() + "': " + std::strerror(errno);
  }
  if (fs::exists(file, ec) && ::access(file.c_str(), W_OK) != 0) {
    return where + std::strerror(errno);
  }
  return "";
}

TextTraining::TextTraining(const TextFlags& flags, const models::Workload& w,
                           comm::ProcessGroupPtr dp_group, int data_rank, int64_t batch_size,
                           uint64_t seed, torch::Device device, bool lead)
    : flags_(flags),
      text_(flags.path(), seq_len_of(w)),
      dp_group_(std::move(dp_group)),
      data_rank_(data_rank),
      batch_size_(batch_size),
      seed_(seed),
      device_(device),
      lead_(lead),
      sampler_([&] {
        data::SamplerOptions options;
        options.size = text_.train_windows();
        options.world_size = dp_group_->world_size();
        options.rank = data_rank;
        options.seed = seed;
        return options;
      }()) {}

std::pair<torch::Tensor, torch::Tensor> TextTraining::next_batch() {
  auto indices = sampler_.next(size_t(batch_size_));
  if (indices && drop_partial_ && indices->size() < size_t(batch_size_)) {
    if (lead_ && !said_dropping_) {
      std::cout << "ddp-train: epoch " << sampler_.epoch() << " ends with a partial batch of "
                << indices->size() << " windows per rank (of " << batch_size_
                << "); each epoch's partial batch is dropped (" << drop_reason_ << ")" << std::endl;
    }
    said_dropping_ = true;
    indices.reset();
  }
  if (!indices) {
    sampler_.set_epoch(sampler_.epoch() + 1);
    indices = sampler_.next(size_t(batch_size_));
  }
  TORCH_CHECK(indices && !indices->empty(), "--data: the sampler gave no windows in epoch ",
              sampler_.epoch());
  return text_.train_batch(std::vector<int64_t>(indices->begin(), indices->end()));
}

int64_t TextTraining::tokens_per_step() const {
  return batch_size_ * text_.seq_len() * dp_group_->world_size();
}

int64_t TextTraining::data_position() const { return sampler_.data_position(); }

void TextTraining::seek(int64_t data_position) { sampler_.seek_data_position(data_position); }

double TextTraining::validation_loss(const TokenForward& forward) const {
  torch::NoGradGuard no_grad;
  // Rank r takes the contiguous windows [r * per_rank, (r + 1) * per_rank) that exist. Every rank
  // runs the same number of forwards (one out of windows runs window 0 and ignores it), since a
  // sharded forward is collective.
  const int64_t n = text_.validation_windows();
  const int64_t per_rank = (n + dp_group_->world_size() - 1) / dp_group_->world_size();
  const int64_t first = std::min(n, data_rank_ * per_rank);
  const int64_t mine = std::min(n, first + per_rank) - first;
  double sum = 0, count = 0;
  for (int64_t done = 0; done < per_rank; done += batch_size_) {
    const int64_t take = std::clamp<int64_t>(mine - done, 0, batch_size_);
    const auto [x, y] =
        text_.validation_batch(take > 0 ? first + done : 0, std::max<int64_t>(take, 1));
    const auto logits = forward(x.to(device_));
    if (take == 0) continue;
    sum += torch::nn::functional::cross_entropy(
               logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), y.reshape({-1}).to(device_),
               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
               .item<double>();
    count += double(y.numel());
  }
  auto totals = torch::tensor({sum, count}, torch::TensorOptions().dtype(torch::kDouble))
                    .to(dp_group_->device());
  dp_group_->allreduce_sum(totals, "validation loss all-reduce");
  totals = totals.cpu();
  return totals[0].item<double>() / totals[1].item<double>();
}

std::optional<double> TextTraining::after_step(int step, int last_step, double train_loss,
                                               const TokenForward& forward, LossCurve& curve,
                                               Progress& progress) {
  if (!evaluates_at(step, last_step)) return std::nullopt;
  const double loss = validation_loss(forward);
  curve.validation.push_back({step, loss});
  if (lead_) {
    char line[160];
    std::snprintf(line, sizeof line, "step %d: validation loss %.4f, training loss %.4f", step,
                  loss, train_loss);
    char json[96];
    std::snprintf(json, sizeof json, "{\"step\":%d,\"val_loss\":%.9g}", step, loss);
    progress.note(line, json);
  }
  return loss;
}

std::string TextTraining::prompt() const { return prompt_from(text_); }

std::string TextTraining::sample_report(const TokenForward& forward) const {
  if (flags_.sample_bytes == 0) return "";
  SampleOptions options;
  options.bytes = flags_.sample_bytes;
  options.seed = seed_;
  options.context = text_.seq_len();
  options.device = device_;
  const std::string start = prompt();
  const std::string bytes = sample_text(forward, start, options);
  std::ostringstream out;
  out << "ddp-train: text sample (" << options.bytes << " bytes, temperature "
      << options.temperature << ", seed " << options.seed
      << ") after a prompt from the validation text\n"
      << "--- prompt ---\n"
      << printable(start) << "\n--- generated ---\n"
      << printable(bytes);
  return out.str();
}

LossPlotOptions TextTraining::plot_options(const std::string& model, int world_size) const {
  const std::string name = std::filesystem::path(text_.path()).filename().string();
  LossPlotOptions options;
  options.title = "ddp-train --data " + name + ": byte-level " + model + ", " +
                  std::to_string(world_size) + (world_size == 1 ? " worker" : " workers");
  std::ostringstream sub;
  sub << text_.size() << " bytes: the first " << text_.train_text().size()
      << " for training, the last " << text_.validation_text().size() << " for validation ("
      << text_.validation_windows() << " windows of " << text_.seq_len()
      << " bytes); loss = cross entropy in nats per byte";
  options.subtitle = sub.str();
  options.train_label = "training loss (mean over ranks)";
  options.validation_label = "validation loss";
  options.y_label = "loss (nats per byte)";
  options.references.push_back({text_.unigram_entropy(), "unigram entropy of the training text"});
  return options;
}

}  // namespace ddp::tools
