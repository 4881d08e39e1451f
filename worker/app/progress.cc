#include "worker/app/progress.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_format.h"

namespace adaps {

namespace {

std::string Clock(double seconds) {
  const long long s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  if (s >= 3600) return absl::StrFormat("%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%lld:%02lld", s / 60, s % 60);
}

}  // namespace

ProgressLine::ProgressLine(std::FILE* out, ProgressOptions options)
    : out_(out), options_(options) {}

bool ProgressLine::IsTerminal(std::FILE* out) { return out != nullptr && isatty(fileno(out)); }

void ProgressLine::BeginEpoch(int epoch, int epochs, int steps, absl::Time now) {
  epoch_ = epoch;
  epochs_ = epochs;
  steps_ = std::max(steps, 1);
  start_ = now;
  last_shown_ = absl::InfinitePast();
  last_bucket_ = 0;
}

bool ProgressLine::Due(int done, absl::Time now) const {
  if (options_.terminal) return now - last_shown_ >= options_.min_interval;
  const int percent = std::clamp(options_.log_percent, 1, 100);
  const int bucket = static_cast<int>(int64_t{done} * 100 / steps_) / percent;
  return bucket > last_bucket_ && done < steps_;  // the epoch's end has its own line
}

std::string ProgressLine::Format(const ProgressSample& s, absl::Time now) const {
  const double elapsed = absl::ToDoubleSeconds(now - start_);
  const double eta = s.done > 0 ? elapsed / s.done * (steps_ - s.done) : 0;
  std::string line =
      absl::StrFormat("epoch %d/%d  step %d/%d (%3d%%)  ETA %s  loss %.4f  %.0f img/s", epoch_ + 1,
                      epochs_, s.done, steps_, static_cast<int>(int64_t{s.done} * 100 / steps_),
                      Clock(eta), s.mean_loss, s.images_per_s);
  if (s.compression > 0) absl::StrAppendFormat(&line, "  compression %.1fx", s.compression);
  return line;
}

void ProgressLine::Print(const ProgressSample& s, absl::Time now) {
  const std::string line = Format(s, now);
  if (options_.terminal) {
    std::fprintf(out_, "\r%s\033[K", line.c_str());
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
  last_shown_ = now;
}

void ProgressLine::Show(const ProgressSample& s, absl::Time now) {
  if (!Due(s.done, now)) return;
  if (!options_.terminal) {
    last_bucket_ =
        static_cast<int>(int64_t{s.done} * 100 / steps_) / std::clamp(options_.log_percent, 1, 100);
  }
  Print(s, now);
}

void ProgressLine::Clear() {
  if (!options_.terminal) return;
  std::fputs("\r\033[K", out_);
  last_shown_ = absl::InfinitePast();
}

void ProgressLine::EndEpoch(const ProgressSample& s, absl::Time now) {
  if (!options_.terminal) return;
  Print(s, now);
  std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace adaps
