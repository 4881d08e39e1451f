// The end of a job without sockets (scheduler/job_end.h).
#include "scheduler/job_end.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

using ::testing::HasSubstr;

TEST(JobEnd, AnOperatorShutdownNeedsTheTokenAndNoneIsAcceptedWithoutOne) {
  EXPECT_EQ(JobEnd("").CheckOperator("").code(), absl::StatusCode::kPermissionDenied);
  const JobEnd end("s3cret");
  EXPECT_EQ(end.CheckOperator("wrong").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(end.CheckOperator("wrong").message()),
              ::testing::Not(HasSubstr("s3cret")));
  EXPECT_TRUE(end.CheckOperator("s3cret").ok());
  EXPECT_EQ(JobEnd::OperatorRequested("done", 0).code, absl::StatusCode::kOk);
  EXPECT_EQ(JobEnd::OperatorRequested("", 10).code, absl::StatusCode::kAborted);
  EXPECT_EQ(JobEnd::OperatorRequested("x", 99).code, absl::StatusCode::kOk);
}

Roster::Node Node(msg::Role role, const std::string& route) {
  Roster::Node n;
  n.role = role;
  n.route = route;
  return n;
}

TEST(JobEnd, AJobEndsWhenNoWorkerIsLiveAndCompletesOnlyWithoutDeadNodes) {
  Roster roster(1, 2, 0, absl::Seconds(30));
  roster.Admit(Node(msg::Role::Server, "s"), -1, 0);
  roster.Admit(Node(msg::Role::Worker, "w0"), -1, 0);
  roster.Admit(Node(msg::Role::Worker, "w1"), -1, 0);
  EXPECT_FALSE(JobEnd::WhenNoWorkerIsLive(roster).has_value());  // not formed
  roster.Form(absl::Now());
  roster.Find(msg::Role::Worker, 0)->left = true;
  EXPECT_FALSE(JobEnd::WhenNoWorkerIsLive(roster).has_value());
  roster.Find(msg::Role::Worker, 1)->left = true;
  auto completed = JobEnd::WhenNoWorkerIsLive(roster);
  ASSERT_TRUE(completed.has_value());
  EXPECT_EQ(completed->code, absl::StatusCode::kOk);
  roster.Find(msg::Role::Server, 0)->alive = false;
  auto aborted = JobEnd::WhenNoWorkerIsLive(roster);
  ASSERT_TRUE(aborted.has_value());
  EXPECT_EQ(aborted->code, absl::StatusCode::kAborted);
  EXPECT_THAT(aborted->text, HasSubstr("Server 0 declared dead"));
}

TEST(JobEnd, TheFirstEndCountsAndSetsTheExitStatus) {
  JobEnd end("");
  EXPECT_FALSE(end.Wait(absl::ZeroDuration()));
  end.End({"worker 1 died", absl::StatusCode::kAborted});
  end.End({"every worker has left"});
  EXPECT_TRUE(end.ended());
  EXPECT_TRUE(end.Wait(absl::ZeroDuration()));
  EXPECT_EQ(end.exit_status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(end.exit_status().message(), "worker 1 died");
}

}  // namespace
}  // namespace adaps
