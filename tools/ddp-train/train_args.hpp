#pragma once
// ddp-train's flags: what a run is asked to do (TrainArgs), the flags that set it, and the
// refusals made before any worker starts.

#include <CLI/CLI.hpp>

#include <string>

#include "common/training_run.hpp"
#include "text_training.hpp"

namespace ddp::tools {

// The shared run flags (tools/common/training_run.hpp): --model net, --nproc (2 without a
// launcher), --lr 0 (the workload's own), the style, --tp, the recipe (--optimizer sgd: momentum
// 0.9 at --lr; adam: --lr / 10; adamw: --lr, default the model's rate / 10), ...
struct TrainArgs : TrainingFlags {
  int steps = 200;
  double peak_tflops = 0;      // --peak-tflops: per device, for MFU; 0: the GPU table's
  bool json = false;           // --json: progress as JSON lines
  std::string backend = "";    // "": gloo on cpu, nccl on cuda
  std::string checkpoint_dir;  // "": no checkpoints
  int checkpoint_every = 0;    // steps between checkpoints; 0: never
  int keep_checkpoints = 3;
  bool checkpoint_async = false;  // --checkpoint-async: written while training goes on
  bool resume = false;
  std::string save_weights;  // "": none; ".pt"/".pth": torch.save format, else safetensors
  int fail_at_step = 0;      // test hook; 0: never
  int fail_rank = 0;
  int unavailable_slot = -1;  // test hook: this LOCAL_RANK fails at start-up on a restart; -1: none
  int max_restarts = 0;       // --max-restarts: the launcher's restarts of every worker
  int min_nproc = 0;          // --min-nproc: the fewest workers to go on with; 0: nproc
  TextFlags text;             // --data, --eval-every, --sample-bytes (text_training.hpp)
  std::string plot;           // --plot FILE.svg; "": none
};

// Every flag of ddp-train, in its --help groups, writing into `args`.
void add_train_flags(CLI::App& app, TrainArgs& args);

// The first refusal of the parsed flags against each other and the environment ("" when they fit):
// text, model, recipe, style, --cuda-graph, --plot, the launcher's variables. Fills the flags'
// derived values (the style's dtypes) as it checks.
std::string train_flags_refusal(const CLI::App& app, TrainArgs& args);

// Checkpoint flags that cannot work together (c10::Error naming them), before any process starts.
void check_checkpoint_flags(const TrainArgs& args);

// The peak learning rate: SGD's the model's own (or --lr); Adam's a tenth of it (as before
// --optimizer adamw existed); AdamW takes --lr as given, else a tenth of the model's SGD rate.
double peak_lr(const TrainArgs& args);

// Set by a launcher that restarts failed workers (ddp-run): > 0 on every restart.
int restart_count();

}  // namespace ddp::tools
