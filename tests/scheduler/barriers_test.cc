// The scheduler's barriers without sockets (scheduler/barriers.h).
#include "scheduler/barriers.h"

#include "gtest/gtest.h"

namespace adaps {
namespace {

Roster::Node Worker(int rank) {
  Roster::Node n;
  n.role = msg::Role::Worker;
  n.rank = rank;
  return n;
}

TEST(Barriers, ABarrierIsReleasedOnceEveryLiveWorkerArrived) {
  std::vector<Roster::Node> nodes = {Worker(0), Worker(1), Worker(2)};
  nodes[2].alive = false;  // a dead worker is not waited for
  Barriers barriers;
  barriers.Arrive(0, {"r0", 10, 0});
  EXPECT_TRUE(barriers.Release(nodes).empty());
  barriers.Arrive(0, {"r1", 11, 1});
  const std::vector<Barriers::Waiter> released = barriers.Release(nodes);
  ASSERT_EQ(released.size(), 2u);
  EXPECT_EQ(released[0].request_id, 10u);
  EXPECT_EQ(released[1].route, "r1");
  EXPECT_EQ(barriers.next(), 1u);
  EXPECT_EQ(barriers.FirstForJoiner(), 1u);
}

TEST(Barriers, AWorkerThatJoinedHoldsUpNoBarrierTheOthersWereWaitingAt) {
  std::vector<Roster::Node> nodes = {Worker(0), Worker(1)};
  Barriers barriers;
  barriers.Arrive(4, {"r0", 1, 0});
  nodes.push_back(Worker(2));
  nodes[2].first_barrier = barriers.FirstForJoiner();
  EXPECT_EQ(nodes[2].first_barrier, 5u);
  nodes[2].barrier_seen = true;
  barriers.Arrive(4, {"r1", 2, 1});
  EXPECT_EQ(barriers.Release(nodes).size(), 2u);
  // From its first barrier on it is waited for.
  barriers.Arrive(5, {"r0", 3, 0});
  barriers.Arrive(5, {"r1", 4, 1});
  EXPECT_TRUE(barriers.Release(nodes).empty());
  barriers.Arrive(5, {"r2", 5, 2});
  EXPECT_EQ(barriers.Release(nodes).size(), 3u);
}

TEST(Barriers, AJoinerThatCalledNoBarrierYetIsNotWaitedFor) {
  std::vector<Roster::Node> nodes = {Worker(0), Worker(1)};
  nodes[1].barrier_seen = false;
  Barriers barriers;
  barriers.Arrive(0, {"r0", 1, 0});
  EXPECT_EQ(barriers.Release(nodes).size(), 1u);
}

}  // namespace
}  // namespace adaps
