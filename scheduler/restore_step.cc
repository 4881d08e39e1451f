#include "scheduler/restore_step.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/step_checkpoint.h"

namespace adaps {

RestoreStep::RestoreStep(int num_servers, Roster& roster, const RoleLog& log)
    : num_servers_(num_servers), roster_(roster), log_(log) {}

std::vector<uint64_t> RestoreStep::StepList(const flatbuffers::Vector<uint64_t>* steps) {
  return steps == nullptr ? std::vector<uint64_t>{}
                          : std::vector<uint64_t>(steps->begin(), steps->end());
}

uint64_t RestoreStep::Common() const {
  std::vector<std::vector<uint64_t>> steps;
  for (const auto& n : roster_.nodes()) {
    if (n.role == msg::Role::Server) steps.push_back(n.checkpoint_steps);
  }
  return static_cast<int>(steps.size()) == num_servers_ ? LatestCommonStep(steps) : 0;
}

uint64_t RestoreStep::For(Roster::Node& server, bool answering) {
  const uint64_t restore_step = Common();
  if (!answering) return restore_step;
  std::string lists;
  for (const auto& n : roster_.nodes()) {
    if (n.role != msg::Role::Server) continue;
    absl::StrAppend(&lists, " server ", n.rank, ":");
    for (uint64_t s : n.checkpoint_steps) absl::StrAppend(&lists, " ", s);
  }
  log_.get()->info("server {} registered: restore step {} (step checkpoints:{})", server.rank,
                   restore_step, lists);
  // Answering its registration: it restores restore_step and removes its later step
  // checkpoints (server/checkpoint.h); so must the list the next restarting server meets.
  auto& mine = server.checkpoint_steps;
  mine.erase(std::remove_if(mine.begin(), mine.end(),
                            [&](uint64_t s) { return s > restore_step; }),
             mine.end());
  return restore_step;
}

}  // namespace adaps
