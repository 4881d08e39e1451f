// The scheduler's part of step checkpoints (common/step_checkpoint.h): which step a
// (re)starting server restores, from the step files every server reported.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/step_checkpoint.h"
#include "scheduler/scheduler.h"

namespace adaps {

std::vector<uint64_t> Scheduler::StepList(const flatbuffers::Vector<uint64_t>* steps) {
  return steps == nullptr ? std::vector<uint64_t>{}
                          : std::vector<uint64_t>(steps->begin(), steps->end());
}

uint64_t Scheduler::CommonStep() const {
  std::vector<std::vector<uint64_t>> steps;
  for (const auto& n : nodes_) {
    if (n.role == msg::Role::Server) steps.push_back(n.checkpoint_steps);
  }
  return static_cast<int>(steps.size()) == config_.num_servers ? LatestCommonStep(steps) : 0;
}

uint64_t Scheduler::RestoreStepFor(const Node& node, bool answering) {
  const uint64_t restore_step = CommonStep();
  if (!answering) return restore_step;
  std::string lists;
  for (const auto& n : nodes_) {
    if (n.role != msg::Role::Server) continue;
    absl::StrAppend(&lists, " server ", n.rank, ":");
    for (uint64_t s : n.checkpoint_steps) absl::StrAppend(&lists, " ", s);
  }
  log_.get()->info("server {} registered: restore step {} (step checkpoints:{})", node.rank,
                   restore_step, lists);
  // Answering its registration: it restores restore_step and removes its later step
  // checkpoints (server/checkpoint.h); so must the list the next restarting server meets.
  for (auto& n : nodes_) {
    if (&n != &node) continue;
    auto& mine = n.checkpoint_steps;
    mine.erase(std::remove_if(mine.begin(), mine.end(),
                              [&](uint64_t s) { return s > restore_step; }),
               mine.end());
  }
  return restore_step;
}

}  // namespace adaps
