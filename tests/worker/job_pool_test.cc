// The worker's compression pool (worker/job_pool.h): jobs start in order, the in-order
// stages run in the order of posting whatever thread finishes first, Stop drains and later
// posts are refused.
#include "worker/job_pool.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

TEST(JobPool, StagesRunInPostingOrderWhenALaterJobFinishesFirst) {
  JobPool pool(3);
  pool.Start();
  absl::Mutex mu;
  std::vector<int> stages;
  absl::Notification release_first, later_done[2];
  auto stage = [&](int k) -> JobPool::Job {
    return [&, k] {
      absl::MutexLock lock(&mu);
      stages.push_back(k);
    };
  };
  ASSERT_TRUE(pool.PostOrdered([&] {
    release_first.WaitForNotification();
    return stage(0);
  }));
  for (int k = 1; k <= 2; ++k) {
    ASSERT_TRUE(pool.PostOrdered([&, k] {
      later_done[k - 1].Notify();
      return stage(k);
    }));
  }
  // Jobs 1 and 2 finish their first halves while job 0 is still blocked.
  later_done[0].WaitForNotification();
  later_done[1].WaitForNotification();
  release_first.Notify();
  pool.Stop();
  EXPECT_EQ(stages, (std::vector<int>{0, 1, 2}));
}

TEST(JobPool, ANullStageKeepsTheOrderGoing) {
  JobPool pool(2);
  pool.Start();
  std::atomic<int> ran{0};
  ASSERT_TRUE(pool.PostOrdered([] { return JobPool::Job(); }));
  ASSERT_TRUE(pool.PostOrdered([&]() -> JobPool::Job { return [&] { ++ran; }; }));
  pool.Stop();
  EXPECT_EQ(ran.load(), 1);
}

TEST(JobPool, OneThreadRunsJobsInTheOrderTheyWerePosted) {
  JobPool pool(1);
  pool.Start();
  std::vector<int> order;  // one thread: no lock needed, read after Stop joined it
  for (int k = 0; k < 50; ++k) {
    if (k % 2 == 0) {
      ASSERT_TRUE(pool.Post([&order, k] { order.push_back(k); }));
    } else {
      ASSERT_TRUE(pool.PostOrdered([&order, k]() -> JobPool::Job {
        order.push_back(k);
        return nullptr;
      }));
    }
  }
  pool.Stop();
  ASSERT_EQ(order.size(), 50u);
  for (int k = 0; k < 50; ++k) EXPECT_EQ(order[k], k);
}

TEST(JobPool, StopRunsWhatIsQueuedAndRefusesLaterPosts) {
  JobPool pool(1);
  pool.Start();
  absl::Notification release;
  std::atomic<int> ran{0};
  ASSERT_TRUE(pool.Post([&] { release.WaitForNotification(); }));
  for (int k = 0; k < 10; ++k) ASSERT_TRUE(pool.Post([&] { ++ran; }));
  release.Notify();
  pool.Stop();
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(pool.Post([&] { ++ran; }));
  EXPECT_FALSE(pool.PostOrdered([] { return JobPool::Job(); }));
  pool.Stop();  // idempotent
}

TEST(JobPool, APoolNotStartedRefusesWork) {
  JobPool pool(1);
  EXPECT_FALSE(pool.Post([] {}));
}

}  // namespace
}  // namespace adaps
