// server/step_members.h: which workers a sync step waits for, view by view.
#include "server/step_members.h"

#include <set>

#include "gtest/gtest.h"

namespace adaps {
namespace {

using W = StepMembers::ViewWorker;

TEST(StepMembers, TheFirstViewsWorkersAreCountedAndALaterOneFromItsFirstPush) {
  StepMembers m;
  EXPECT_FALSE(m.OnView(2, {W{0}, W{1}}));
  EXPECT_EQ(m.live(), (std::set<int>{0, 1}));
  EXPECT_EQ(m.num_workers(), 2);
  // A joiner is live in the view but not waited for until it reaches this server.
  EXPECT_FALSE(m.OnView(3, {W{0}, W{1}, W{2}}));
  EXPECT_EQ(m.live(), (std::set<int>{0, 1}));
  EXPECT_EQ(m.view_live(), 3u);
  EXPECT_EQ(m.num_workers(), 3);
  EXPECT_TRUE(m.Count(2));
  EXPECT_FALSE(m.Count(2)) << "counted once";
  EXPECT_EQ(m.live(), (std::set<int>{0, 1, 2}));
}

TEST(StepMembers, AWorkerThatDiesIsDroppedAndSaidSo) {
  StepMembers m;
  m.OnView(3, {W{0}, W{1}, W{2}});
  EXPECT_TRUE(m.OnView(3, {W{0}, W{1, false}, W{2}})) << "a counted worker was lost";
  EXPECT_EQ(m.live(), (std::set<int>{0, 2}));
  // An uncounted joiner leaving loses nobody a step waits for.
  m.OnView(4, {W{0}, W{1, false}, W{2}, W{3}});
  EXPECT_FALSE(m.OnView(4, {W{0}, W{1, false}, W{2}, W{3, false}}));
}

// A server restarted mid-job: its first view shows a joiner still starting up (not stepping):
// it is not waited for until it declares or pushes; the workers that step are.
TEST(StepMembers, ARestartedServerDoesNotWaitForAJoinerThatIsNotSteppingYet) {
  StepMembers m;
  m.OnView(3, {W{0}, W{1}, W{2, true, /*stepping=*/false}});
  EXPECT_EQ(m.live(), (std::set<int>{0, 1}));
  // A later view saying it steps does not count it either: its declaration here does.
  m.OnView(3, {W{0}, W{1}, W{2}});
  EXPECT_EQ(m.live(), (std::set<int>{0, 1}));
  EXPECT_TRUE(m.Count(2));
  EXPECT_EQ(m.live(), (std::set<int>{0, 1, 2}));
}

}  // namespace
}  // namespace adaps
