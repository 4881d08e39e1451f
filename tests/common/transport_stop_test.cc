// Post racing Stop (common/transport.cc): a Post that queued its job just before Stop must
// not write its wake-up to the eventfd after Stop closed it (the number may belong to
// another file by then), and its job still runs. The race is made certain by holding the
// poster inside its eventfd write: this binary interposes write(2) (the transport's code is
// linked in statically, so its calls bind here) and records writes to a closed descriptor.
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "common/transport.h"
#include "gtest/gtest.h"

namespace {
thread_local int delay_writes_ms = 0;
std::atomic<int> writes_to_closed_fds{0};
}  // namespace

extern "C" ssize_t write(int fd, const void* buf, size_t count) {
  if (delay_writes_ms > 0) {
    absl::SleepFor(absl::Milliseconds(delay_writes_ms));
    if (::fcntl(fd, F_GETFD) == -1) ++writes_to_closed_fds;
  }
  return ::syscall(SYS_write, fd, buf, count);
}

namespace adaps {
namespace {

TEST(TransportStop, APostRacingStopNeverWritesToTheClosedWakeupFdAndItsJobRuns) {
  TransportOptions o;
  o.self = Sender{msg::Role::Worker, 0};
  Transport t(o, nullptr);
  ASSERT_TRUE(t.Start().ok());
  std::atomic<bool> ran{false};
  bool posted = false;
  std::thread poster([&] {
    delay_writes_ms = 300;  // queued, then held in its wake-up write while Stop runs
    posted = t.Post([&] { ran = true; });
    delay_writes_ms = 0;
  });
  absl::SleepFor(absl::Milliseconds(100));
  t.Stop();
  poster.join();
  EXPECT_TRUE(posted);
  EXPECT_TRUE(ran) << "a Post that returned true lost its job";
  EXPECT_EQ(writes_to_closed_fds.load(), 0) << "the wake-up was written after Stop closed the fd";
}

}  // namespace
}  // namespace adaps
