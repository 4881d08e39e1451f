#include "worker/app/progress.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

// What `run` wrote to a ProgressLine over an in-memory FILE.
template <typename F>
std::string Captured(bool terminal, F run) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buf, &size);
  {
    ProgressLine line(out, ProgressOptions{terminal});
    run(line);
  }
  std::fclose(out);
  std::string text(buf, size);
  std::free(buf);
  return text;
}

// One epoch of `steps` steps, one step every 100 ms, loss 1/(step+1).
void Epoch(ProgressLine& line, int steps) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  line.BeginEpoch(0, 3, steps, t0);
  double loss_sum = 0;
  for (int done = 1; done <= steps; ++done) {
    loss_sum += 1.0 / done;
    const absl::Time now = t0 + absl::Milliseconds(100) * done;
    line.Show({done, loss_sum / done, 64 / 0.1, 40.0}, now);
  }
  line.EndEpoch({steps, loss_sum / steps, 640, 40.0}, t0 + absl::Milliseconds(100) * steps);
}

TEST(ProgressLine, InALogPrintsOnePlainLinePerTenthOfTheEpoch) {
  const std::string text = Captured(false, [](ProgressLine& l) { Epoch(l, 200); });
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\033'), std::string::npos);
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 9u) << text;  // 10% .. 90%; the epoch's end has its own line
  EXPECT_EQ(lines[0],
            "epoch 1/3  step 20/200 ( 10%)  ETA 0:18  loss 0.1799  640 img/s  compression 40.0x");
  EXPECT_TRUE(absl::StartsWith(lines[8], "epoch 1/3  step 180/200 ( 90%)  ETA 0:02")) << lines[8];
}

TEST(ProgressLine, OnATerminalRewritesOneLineAtMostFourTimesASecond) {
  const std::string text = Captured(true, [](ProgressLine& l) { Epoch(l, 20); });
  // 2 s of steps at 250 ms: the first step, then every third step (300 ms apart), and the end.
  std::vector<std::string> draws = absl::StrSplit(text, '\r', absl::SkipEmpty());
  EXPECT_EQ(draws.size(), 8u) << text;
  for (size_t i = 0; i + 1 < draws.size(); ++i) {
    EXPECT_TRUE(absl::EndsWith(draws[i], "\033[K")) << draws[i];
    EXPECT_EQ(draws[i].find('\n'), std::string::npos) << draws[i];
  }
  EXPECT_TRUE(absl::StartsWith(draws.back(), "epoch 1/3  step 20/20 (100%)  ETA 0:00"));
  EXPECT_TRUE(absl::EndsWith(text, "\033[K\n"));
}

TEST(ProgressLine, ClearOnATerminalErasesTheLineForAnotherMessage) {
  const std::string text = Captured(true, [](ProgressLine& l) {
    l.BeginEpoch(0, 1, 10, absl::FromUnixSeconds(0));
    l.Show({1, 0.5, 10, 0}, absl::FromUnixSeconds(1));
    l.Clear();
  });
  EXPECT_TRUE(absl::EndsWith(text, "\r\033[K")) << text;
  EXPECT_EQ(text.find("compression"), std::string::npos) << "no compression known: not shown";
}

}  // namespace
}  // namespace adaps
