// What the scheduler and the servers agree on about step checkpoints (the files are the
// server's: server/checkpoint.h). Pure functions; thread-safe.
#ifndef ADAPS_COMMON_STEP_CHECKPOINT_H_
#define ADAPS_COMMON_STEP_CHECKPOINT_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace adaps {

// The largest step that is in every list (each a server's step checkpoints); 0 when there
// is none (or no list): the step a (re)starting server restores.
inline uint64_t LatestCommonStep(const std::vector<std::vector<uint64_t>>& steps) {
  uint64_t latest = 0;
  if (steps.empty()) return latest;
  for (uint64_t step : steps[0]) {
    bool everywhere = step > latest;
    for (size_t k = 1; k < steps.size() && everywhere; ++k) {
      everywhere = std::find(steps[k].begin(), steps[k].end(), step) != steps[k].end();
    }
    if (everywhere) latest = step;
  }
  return latest;
}

}  // namespace adaps

#endif  // ADAPS_COMMON_STEP_CHECKPOINT_H_
