#pragma once
// The resume check of the tools' tests: one run saves a checkpoint at its last step, a second
// continues from it (at another world size, style or batch split), a third runs the whole way;
// the continued run ends with the straight run's weights (support/same_weights.hpp).

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>

#include "support/same_weights.hpp"

namespace ddp::testing {

// Each run's arguments without the checkpoint and weight flags, which expect_resume adds.
struct ResumeRuns {
  std::string saved;     // runs to saved_step and checkpoints it
  std::string resumed;   // resumes from that checkpoint and runs to the end
  std::string straight;  // runs from step 0 to the end
  int saved_step = 0;    // what the resumed run must say it resumed at ("at step N")
};

// What each run printed, for checks of the caller's own.
struct ResumeOutputs {
  std::string saved, resumed, straight;
};

// A tool run: its output and exit code (run_command with the tool's path in front).
using ToolRun = std::function<std::pair<std::string, int>(const std::string& args)>;

// Runs the three under `dir` (dir/ckpt, dir/resumed.safetensors, dir/straight.safetensors) and
// fails the test where one fails, the resumed run does not say where it resumed, or the weights
// differ.
inline void expect_resume(const ToolRun& run, const ResumeRuns& runs, const std::string& dir,
                          ResumeOutputs* outputs = nullptr) {
  ResumeOutputs out;
  const std::string ckpt = " --checkpoint-dir " + dir + "/ckpt";
  const std::string step = std::to_string(runs.saved_step);
  int code = 0;
  std::tie(out.saved, code) = run(runs.saved + ckpt + " --checkpoint-every " + step);
  ASSERT_EQ(code, 0) << out.saved;
  std::tie(out.resumed, code) =
      run(runs.resumed + ckpt + " --resume --save-weights " + dir + "/resumed.safetensors");
  ASSERT_EQ(code, 0) << out.resumed;
  EXPECT_NE(out.resumed.find("at step " + step), std::string::npos) << out.resumed;
  std::tie(out.straight, code) =
      run(runs.straight + " --save-weights " + dir + "/straight.safetensors");
  ASSERT_EQ(code, 0) << out.straight;
  expect_same_weights(dir + "/straight.safetensors", dir + "/resumed.safetensors");
  if (outputs != nullptr) *outputs = std::move(out);
}

}  // namespace ddp::testing
