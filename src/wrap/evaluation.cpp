#include "ddp/wrap/evaluation.hpp"

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "ddp/obs/log.hpp"

namespace ddp::wrap {

Evaluation WrappedModel::evaluation() { return Evaluation(*this); }

Evaluation::Evaluation(WrappedModel& model)
    : model_(model), was_training_(model.module_ptr()->is_training()) {
  TORCH_CHECK(!model_.evaluating_,
              "ddp: an evaluation of this model is already open: one at a time (nested "
              "model.evaluation() scopes would put the shards back at the inner one's end)");
  model_.begin_evaluation();
  model_.evaluating_ = true;
  model_.module_ptr()->eval();
}

Evaluation::~Evaluation() {
  model_.evaluating_ = false;
  if (was_training_) model_.module_ptr()->train();
  try {
    model_.end_evaluation();
  } catch (const std::exception& e) {
    // A destructor cannot throw; the next forward's state check names what is left.
    obs::log(obs::LogLevel::kWarn, model_.group()->rank(),
             std::string("ddp: the end of an evaluation failed: ") + e.what());
  }
}

}  // namespace ddp::wrap
