// Load: 16 workers (threads with the worker library) on loopback, 100 synchronous steps,
// 2 real server processes. Every update is counted exactly once (sum-only optimizer,
// integer-valued pushes: the parameters are exact checksums), no request misses its
// deadline, and the servers' resident memory stays flat (sampled from /proc).
#include <atomic>
#include <fstream>
#include <thread>
#include <vector>

#include "adaps/worker.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace adaps {
namespace {

using ::adaps::testing::ClusterOptions;
using ::adaps::testing::LocalCluster;

constexpr int kWorkers = 16, kSteps = 100;
constexpr size_t kLen = 100000;  // split over both servers

// Resident set of `pid` in KiB (VmRSS), 0 when unreadable.
long RssKiB(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  long value = 0;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> value;
      return value;
    }
    in.ignore(1 << 12, '\n');
  }
  return 0;
}

TEST(Load, SixteenWorkersHundredSyncStepsEveryUpdateOnceAndMemoryFlat) {
  ClusterOptions c;
  c.num_servers = 2;
  c.num_workers = kWorkers;
  c.scheduler_args = {"--split_threshold=1000"};
  c.server_args = {"--optimizer=sum"};
  LocalCluster cluster(c);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  std::atomic<int> failures{0}, deadline_errors{0}, at_step{0};
  std::vector<std::vector<long>> rss(2);
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling) {
      for (int s = 0; s < 2; ++s) rss[s].push_back(RssKiB(cluster.server(s).pid()));
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  std::vector<std::thread> threads;
  std::vector<float> final0;
  for (int i = 0; i < kWorkers; ++i) {
    threads.emplace_back([&, i] {
      WorkerOptions o;
      o.scheduler = cluster.scheduler_address();
      o.register_timeout = absl::Seconds(30);
      o.request_timeout = absl::Seconds(30);
      o.log_level = "warn";
      auto w = Worker::Create(o);
      ASSERT_TRUE(w.ok()) << w.status();
      const int r = (*w)->rank();
      std::vector<float> p(kLen, 0.0f), g(kLen);
      ASSERT_TRUE((*w)->Declare({"t", {kLen}, 500, Compression::kDense}, absl::MakeSpan(p)).ok());
      for (int s = 0; s < kSteps; ++s) {
        // Worker r pushes r+1 at step s on element (s % 1000) * 100 + ..., and 1 elsewhere:
        // every element's final value is an exact integer sum.
        for (size_t k = 0; k < kLen; ++k) g[k] = (k % kSteps == static_cast<size_t>(s)) ? r + 1 : 1;
        absl::Status st = (*w)->PushPull("t", g, absl::MakeSpan(p)).get();
        if (!st.ok()) {
          ++failures;
          if (st.code() == absl::StatusCode::kDeadlineExceeded) ++deadline_errors;
          ADD_FAILURE() << "worker " << r << " step " << s << ": " << st;
          break;
        }
        if (i == 0) at_step = s;
      }
      if (r == 0) final0 = p;
      EXPECT_TRUE((*w)->Stop().ok());
    });
  }
  for (auto& t : threads) t.join();
  sampling = false;
  sampler.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(deadline_errors.load(), 0);
  // Element k got, at step k % 100, sum_r (r+1) = 136, and 16 at each of the other 99 steps.
  ASSERT_EQ(final0.size(), kLen);
  const float expected = 136.0f + 16.0f * (kSteps - 1);
  for (size_t k = 0; k < kLen; ++k) ASSERT_EQ(final0[k], expected) << k;
  // Memory flat: the last quarter of the run within 10% (+2 MiB) of the second quarter.
  // (Not under AddressSanitizer: its quarantine keeps up to 256 MB of freed memory.)
#if defined(__SANITIZE_ADDRESS__)
  const bool check_rss = false;
#else
  const bool check_rss = true;
#endif
  for (int s = 0; s < 2 && check_rss; ++s) {
    const auto& v = rss[s];
    ASSERT_GE(v.size(), 8u);
    const long mid = v[v.size() / 2 - 1], last = v[v.size() - 2];
    EXPECT_LE(last, mid + mid / 10 + 2048) << "server " << s << " RSS grew from " << mid
                                           << " to " << last << " KiB";
    std::printf("server %d RSS KiB: mid %ld last %ld (%zu samples)\n", s, mid, last, v.size());
  }
  std::string why;
  EXPECT_TRUE(cluster.AllExitCleanly(absl::Seconds(10), &why)) << why;
}

}  // namespace
}  // namespace adaps
