#include "ddp/shard/unit_schedule.hpp"

#include <ATen/record_function.h>

#include <algorithm>

#include "ddp/gradients/gradient_runtime.hpp"

namespace ddp::shard {

UnitSchedule::UnitSchedule(const ShardPlan& plan, const std::vector<at::Tensor>& params,
                           const comm::ProcessGroupPtr& pg, const ShardOptions& options)
    : reshard_after_forward_(options.reshard_after_forward), prefetch_(options.prefetch) {
  group_of_unit_.assign(plan.units.size(), -1);
  run_by_model_.assign(plan.units.size(), false);
  for (size_t u = 0; u < plan.units.size(); ++u) {
    bool any_sharded = false;
    for (size_t i : plan.units[u].params) {
      any_sharded |= plan.params[i].sharded();
    }
    if (!any_sharded) continue;
    group_of_unit_[u] = static_cast<int>(groups_.size());
    unit_of_group_.push_back(u);
    groups_.push_back(std::make_unique<FlatParamGroup>(plan, u, params, pg));
  }
}

std::vector<size_t> UnitSchedule::expected_backward_order() const {
  std::vector<size_t> expected;
  for (auto it = last_order_.rbegin(); it != last_order_.rend(); ++it) {
    if (group_of_unit_[*it] >= 0) expected.push_back(static_cast<size_t>(group_of_unit_[*it]));
  }
  return expected;
}

void UnitSchedule::begin_forward() {
  order_.clear();
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!run_by_model_[unit_of_group_[g]]) gather(g);
  }
}

bool UnitSchedule::end_forward() {
  last_order_ = order_;
  const bool first = !first_forward_done_;
  first_forward_done_ = true;
  if (first) {
    // The gather pool serves the units gathered one after another (those the model runs through
    // run_unit); a unit gathered for the whole step (the root: a GPT's embeddings, often the
    // largest) keeps an output of its own, or the pool's buffer would be its size all step.
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (run_by_model_[unit_of_group_[g]]) groups_[g]->use_gather_pool(&gather_pool_);
    }
  }
  return first;
}

void UnitSchedule::before_unit_forward(size_t unit, bool in_forward) {
  if (in_forward && std::find(order_.begin(), order_.end(), unit) == order_.end()) {
    order_.push_back(unit);
    run_by_model_[unit] = true;
  }
  const int g = group_of_unit_[unit];
  if (g >= 0) gather(static_cast<size_t>(g));
  if (in_forward) prefetch_after(unit, /*backward=*/false);
}

void UnitSchedule::after_unit_forward(size_t unit, bool grad_enabled) {
  const int g = group_of_unit_[unit];
  if (g >= 0 && (reshard_after_forward_ || !grad_enabled)) {
    groups_[static_cast<size_t>(g)]->free_full();
  }
}

void UnitSchedule::start_backward() {
  if (!prefetch_ || last_order_.empty()) return;
  const int g = group_of_unit_[last_order_.back()];
  if (g >= 0) groups_[static_cast<size_t>(g)]->start_unshard();
  note_memory();
}

void UnitSchedule::before_unit_backward(size_t unit) {
  const int g = group_of_unit_[unit];
  if (g >= 0 && !reduced(static_cast<size_t>(g))) gather(static_cast<size_t>(g));
  prefetch_after(unit, /*backward=*/true);
}

void UnitSchedule::unit_reduced(size_t g, bool synchronized) {
  if (synchronized) {
    note_memory();  // the unit's reduce input was filled and its full buffer released
  } else if (run_by_model_[unit_of_group_[g]]) {
    groups_[g]->free_full();  // no_sync: the full gradients stay, the parameters can go
  }
}

void UnitSchedule::reshard_all() {
  for (auto& group : groups_) group->reshard();
  gather_pool_.release();
}

void UnitSchedule::gather_all() {
  for (size_t g = 0; g < groups_.size(); ++g) gather(g);
}

void UnitSchedule::end_step() { gather_pool_.release(); }

void UnitSchedule::note_memory() {
  GatheredBytes now;
  now.reduce_input = reducer_ ? reducer_->input_bytes() : 0;
  now.gather_output = gather_pool_.allocated_bytes();
  for (const auto& group : groups_) {
    now.full_params += group->full_buffer_bytes();
    now.gather_output += group->own_gather_bytes();
  }
  peak_by_owner_.full_params = std::max(peak_by_owner_.full_params, now.full_params);
  peak_by_owner_.gather_output = std::max(peak_by_owner_.gather_output, now.gather_output);
  peak_by_owner_.reduce_input = std::max(peak_by_owner_.reduce_input, now.reduce_input);
  peak_gathered_bytes_ =
      std::max(peak_gathered_bytes_, now.full_params + now.gather_output + now.reduce_input);
}

void UnitSchedule::gather(size_t g) {
  RECORD_USER_SCOPE("ddp::gather_unit");
  // The parameters' tensor hooks stay through unshard's set_() ([Note: hooks that survive set_]
  // in gradients/unit_buckets.hpp): nothing to install per step.
  groups_[g]->unshard();
  note_memory();
}

void UnitSchedule::prefetch_after(size_t unit, bool backward) {
  if (!prefetch_) return;
  const auto it = std::find(last_order_.begin(), last_order_.end(), unit);
  if (it == last_order_.end()) return;
  size_t next;
  if (backward) {
    if (it == last_order_.begin()) return;
    next = *(it - 1);
  } else {
    if (it + 1 == last_order_.end()) return;
    next = *(it + 1);
  }
  const int g = group_of_unit_[next];
  if (g < 0 || reduced(static_cast<size_t>(g))) return;
  groups_[static_cast<size_t>(g)]->start_unshard();
  note_memory();
}

bool UnitSchedule::reduced(size_t g) const { return reducer_ != nullptr && reducer_->filled(g); }

}  // namespace ddp::shard
