// The transport: deadlines for absent peers, binding errors, and its own-thread assertion
// (ADAPS_DCHECK_ON_IO_THREAD).
#include <future>

#include "common/transport.h"
#include "gmock/gmock.h"
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

TEST(Transport, RequestToAbsentPeerIsUnavailableWithinItsDeadline) {
  TransportOptions to;
  to.self = Sender{msg::Role::Worker, 0};
  Transport t(to, nullptr);
  ASSERT_TRUE(t.Start().ok());
  ASSERT_TRUE(t.Connect("tcp://127.0.0.1:1").ok());
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreateBarrier(fbb, 0);
  const uint64_t id = t.NewRequestId();
  std::promise<absl::Status> p;
  const absl::Time start = absl::Now();
  t.Request(0, id, FinishEnvelope(fbb, t.self(), body, id, 0), start + absl::Milliseconds(200),
            [&](absl::StatusOr<InMessage> r) { p.set_value(r.status()); });
  absl::Status s = p.get_future().get();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  t.Stop();
}

TEST(Transport, BindingAnAddressInUseIsUnavailable) {
  TransportOptions a;
  a.bind_endpoint = "tcp://127.0.0.1:0";
  Transport first(a, nullptr);
  ASSERT_TRUE(first.Start().ok());
  TransportOptions b;
  b.bind_endpoint = first.bound_endpoint();
  Transport second(b, nullptr);
  absl::Status s = second.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("address in use"));
}

}  // namespace
}  // namespace adaps
