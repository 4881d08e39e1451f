// The transport's own-thread assertion (ADAPS_DCHECK_ON_IO_THREAD).
#include <future>

#include "common/transport.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

TEST(TransportDeathTest, IoThreadCheckAbortsOffTheIoThread) {
#if defined(NDEBUG) && !defined(ADAPS_DCHECKS)
  GTEST_SKIP() << "debug assertions are compiled out of this build";
#endif
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  TransportOptions o;
  o.self = Sender{msg::Role::Worker, 0};
  Transport t(o, nullptr);
  ASSERT_TRUE(t.Start().ok());
  EXPECT_DEATH(ADAPS_DCHECK_ON_IO_THREAD(&t), "not on the I/O thread");
  t.Stop();
}

TEST(Transport, IoThreadCheckPassesOnTheIoThread) {
  TransportOptions o;
  o.self = Sender{msg::Role::Worker, 0};
  Transport t(o, nullptr);
  ASSERT_TRUE(t.Start().ok());
  std::promise<bool> ran;
  ASSERT_TRUE(t.Post([&] {
    ADAPS_DCHECK_ON_IO_THREAD(&t);
    ran.set_value(true);
  }));
  EXPECT_TRUE(ran.get_future().get());
  t.Stop();
}

}  // namespace
}  // namespace adaps
