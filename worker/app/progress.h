// A progress line per epoch for a person watching a training run (adaps-worker --mode=train):
// steps done of the epoch, ETA, mean loss so far, throughput and compression.
//
// On a terminal the line is rewritten in place ("\r" ... erase to end of line) at most every
// `min_interval`, and ended with a newline when the epoch ends. In a log (not a terminal)
// it prints a plain line each time another `log_percent` of the epoch is done, so a log of
// E epochs holds about E * 100 / log_percent such lines, never one per step.
//
// Owned by the trainer's thread; not thread-safe. Writes only to the FILE it was given.
#ifndef ADAPS_WORKER_APP_PROGRESS_H_
#define ADAPS_WORKER_APP_PROGRESS_H_

#include <cstdio>
#include <string>

#include "absl/time/time.h"

namespace adaps {

struct ProgressOptions {
  bool terminal = false;  // ProgressLine::IsTerminal(out) for the real thing
  absl::Duration min_interval = absl::Milliseconds(250);
  int log_percent = 10;  // 1..100
};

struct ProgressSample {
  int done = 0;             // steps done in this epoch
  double mean_loss = 0;     // over those steps
  double images_per_s = 0;  // throughput of this worker over the epoch so far
  double compression = 0;   // dense / wire bytes pushed so far (0: unknown)
};

class ProgressLine {
 public:
  ProgressLine(std::FILE* out, ProgressOptions options);
  // Whether `out` is a terminal (isatty).
  static bool IsTerminal(std::FILE* out);

  void BeginEpoch(int epoch, int epochs, int steps, absl::Time now);
  // Whether Show would print for `done` steps at `now`: lets the caller skip gathering a
  // sample (the compression needs the traffic counters) when nothing would be shown.
  bool Due(int done, absl::Time now) const;
  // Prints the line when Due.
  void Show(const ProgressSample& sample, absl::Time now);
  // Terminal: clears the line so that another message can be printed (the next Show draws
  // it again). Log: nothing.
  void Clear();
  // Terminal: the final state of the line and a newline. Log: nothing more.
  void EndEpoch(const ProgressSample& sample, absl::Time now);

  // The text of the line, without "\r" or newline. For tests.
  std::string Format(const ProgressSample& sample, absl::Time now) const;

 private:
  void Print(const ProgressSample& sample, absl::Time now);

  std::FILE* out_;
  const ProgressOptions options_;
  int epoch_ = 0, epochs_ = 0, steps_ = 0;
  absl::Time start_;
  absl::Time last_shown_ = absl::InfinitePast();
  int last_bucket_ = 0;  // log: the last log_percent boundary printed
};

}  // namespace adaps

#endif  // ADAPS_WORKER_APP_PROGRESS_H_
