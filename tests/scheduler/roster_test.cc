// The scheduler's rank rules without sockets (scheduler/roster.h): fresh ranks, a claim after
// a scheduler restart winning over a provisional rank, identities taking their rank back,
// joins, heartbeats from the wrong connection, deaths.
#include "scheduler/roster.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

using ::testing::HasSubstr;
using Outcome = Roster::Admission::Outcome;

constexpr absl::Duration kDead = absl::Seconds(30);

Roster::Node Fresh(msg::Role role, const std::string& route, const std::string& identity = "") {
  Roster::Node n;
  n.role = role;
  n.route = route;
  n.identity = identity;
  n.address = role == msg::Role::Server ? "tcp://" + route : "";
  n.last_seen = absl::Now();
  return n;
}

int RankOf(const Roster& roster, const std::string& route) {
  for (const auto& n : roster.nodes()) {
    if (n.route == route) return n.rank;
  }
  return -100;
}

TEST(Roster, FreshNodesGetTheLowestFreeRanksAndTheJobFormsWhenEveryOneIsIn) {
  Roster roster(2, 1, 0, kDead);
  EXPECT_EQ(roster.Admit(Fresh(msg::Role::Server, "a"), -1, 0).node->rank, 0);
  EXPECT_FALSE(roster.complete());
  EXPECT_EQ(roster.Admit(Fresh(msg::Role::Server, "b"), -1, 0).node->rank, 1);
  const Roster::Admission w = roster.Admit(Fresh(msg::Role::Worker, "w"), -1, 0);
  ASSERT_EQ(w.outcome, Outcome::kAdded);
  EXPECT_EQ(w.node->rank, 0);
  EXPECT_EQ(w.node->secret.size(), 32u);  // 16 random bytes, hex
  EXPECT_TRUE(roster.complete());
  const Roster::Admission extra = roster.Admit(Fresh(msg::Role::Server, "c"), -1, 0);
  EXPECT_EQ(extra.outcome, Outcome::kRefused);
  EXPECT_THAT(extra.refusal.message(), HasSubstr("already have 2 Servers"));
}

// A node whose connection closed before the job formed registers again on its new one, with
// the same routing id (transport.cc): the scheduler answers that Register for the node it
// has (scheduler.cc), found here, and admits no second node.
TEST(Roster, ANodeRegisteringAgainOnItsConnectionBeforeTheJobFormsIsFound) {
  Roster roster(1, 2, 0, kDead);
  ASSERT_EQ(roster.Admit(Fresh(msg::Role::Worker, "w"), -1, 0).outcome, Outcome::kAdded);
  const Roster::Node* again = roster.RegisteredBeforeForming(msg::Role::Worker, "w");
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->rank, 0);
  EXPECT_EQ(roster.RegisteredBeforeForming(msg::Role::Worker, "other"), nullptr);
  EXPECT_EQ(roster.RegisteredBeforeForming(msg::Role::Server, "w"), nullptr);
  ASSERT_EQ(roster.Admit(Fresh(msg::Role::Worker, "v"), -1, 0).outcome, Outcome::kAdded);
  ASSERT_EQ(roster.Admit(Fresh(msg::Role::Server, "s"), -1, 0).outcome, Outcome::kAdded);
  ASSERT_TRUE(roster.complete());
  roster.Form(absl::Now());
  // Formed: a Register is a join or a rejoin, decided by the rules below.
  EXPECT_EQ(roster.RegisteredBeforeForming(msg::Role::Worker, "w"), nullptr);
}

TEST(Roster, ARankClaimedAfterASchedulerRestartWinsOverAFreshNodesProvisionalOne) {
  Roster roster(2, 1, 0, kDead);
  ASSERT_EQ(roster.Admit(Fresh(msg::Role::Server, "fresh"), -1, 0).node->rank, 0);
  // The survivor's heartbeat claims rank 0 before it registers: it is told to register.
  EXPECT_EQ(roster.FromHeartbeat(msg::Role::Server, 0, "survivor").status().code(),
            absl::StatusCode::kFailedPrecondition);
  const Roster::Admission claim = roster.Admit(Fresh(msg::Role::Server, "survivor"), 0, 0);
  ASSERT_EQ(claim.outcome, Outcome::kAdded);
  EXPECT_EQ(claim.node->rank, 0);
  EXPECT_TRUE(claim.node->rank_claimed);
  ASSERT_NE(claim.moved, nullptr);
  EXPECT_EQ(claim.moved->route, "fresh");
  EXPECT_EQ(RankOf(roster, "fresh"), 1);
}

TEST(Roster, AClaimedRankIsNotTakenByASecondClaim) {
  Roster roster(2, 1, 0, kDead);
  ASSERT_EQ(roster.Admit(Fresh(msg::Role::Server, "first"), 1, 0).node->rank, 1);
  const Roster::Admission second = roster.Admit(Fresh(msg::Role::Server, "second"), 1, 0);
  EXPECT_EQ(second.node->rank, 0);
  EXPECT_EQ(second.moved, nullptr);
  EXPECT_EQ(RankOf(roster, "first"), 1);
  // A claimed rank held by its node: another connection claiming it is a forger.
  EXPECT_EQ(roster.FromHeartbeat(msg::Role::Server, 1, "forger").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(Roster, ANodeWithAKnownIdentityTakesItsRankBackAtItsNewAddress) {
  Roster roster(1, 1, 0, kDead);
  roster.Admit(Fresh(msg::Role::Worker, "w", "w0"), -1, 0);
  roster.Admit(Fresh(msg::Role::Server, "s", "s0"), -1, 0);
  roster.Form(absl::Now());
  EXPECT_EQ(roster.Rejoin(Fresh(msg::Role::Server, "x", "nobody")).node, nullptr);
  const Roster::Rejoined back = roster.Rejoin(Fresh(msg::Role::Server, "s2", "s0"));
  ASSERT_NE(back.node, nullptr);
  EXPECT_EQ(back.node->rank, 0);
  EXPECT_TRUE(back.moved);
  EXPECT_FALSE(back.was_dead);
  EXPECT_TRUE(roster.FromHeartbeat(msg::Role::Server, 0, "s2").ok());
  EXPECT_EQ(roster.FromHeartbeat(msg::Role::Server, 0, "s").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(Roster, WorkersJoinTheFormedJobWhileFewerThanMaxWorkersAreLive) {
  Roster roster(1, 1, 2, kDead);
  roster.Admit(Fresh(msg::Role::Server, "s"), -1, 0);
  roster.Admit(Fresh(msg::Role::Worker, "w0"), -1, 0);
  roster.Form(absl::Now());
  const Roster::Admission joined = roster.Admit(Fresh(msg::Role::Worker, "w1"), -1, 7);
  ASSERT_EQ(joined.outcome, Outcome::kJoined);
  EXPECT_EQ(joined.node->rank, 1);
  EXPECT_EQ(joined.node->first_barrier, 7u);
  EXPECT_FALSE(joined.node->barrier_seen);
  EXPECT_FALSE(joined.node->stepping);
  EXPECT_EQ(roster.WorkerRanks(), 2);
  const Roster::Admission full = roster.Admit(Fresh(msg::Role::Worker, "w2"), -1, 7);
  EXPECT_EQ(full.outcome, Outcome::kRefused);
  EXPECT_THAT(full.refusal.message(), HasSubstr("2 live workers, --max_workers=2"));
}

TEST(Roster, WithoutMaxWorkersALateWorkerIsToldHowToLetWorkersJoin) {
  Roster roster(1, 1, 0, kDead);
  roster.Admit(Fresh(msg::Role::Server, "s"), -1, 0);
  roster.Admit(Fresh(msg::Role::Worker, "w0"), -1, 0);
  roster.Form(absl::Now());
  const Roster::Admission late = roster.Admit(Fresh(msg::Role::Worker, "w1"), -1, 0);
  EXPECT_EQ(late.outcome, Outcome::kRefused);
  EXPECT_EQ(late.refusal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.refusal.message(), HasSubstr("--max_workers"));
}

TEST(Roster, WorkersBeyondNumWorkersBeforeTheJobFormsAreHeldUpToMaxWorkers) {
  Roster roster(1, 1, 3, kDead);
  roster.Admit(Fresh(msg::Role::Worker, "w0"), -1, 0);
  EXPECT_EQ(roster.Admit(Fresh(msg::Role::Worker, "w1"), -1, 0).outcome, Outcome::kHeld);
  EXPECT_EQ(roster.Admit(Fresh(msg::Role::Worker, "w2"), -1, 0).outcome, Outcome::kHeld);
  EXPECT_EQ(roster.Admit(Fresh(msg::Role::Worker, "w3"), -1, 0).outcome, Outcome::kRefused);
}

TEST(Roster, ASilentNodeIsDeclaredDeadAndOneWithoutIdentityIsToldItCannotComeBack) {
  Roster roster(1, 2, 0, kDead);
  roster.Admit(Fresh(msg::Role::Server, "s", "s0"), -1, 0);
  roster.Admit(Fresh(msg::Role::Worker, "w0"), -1, 0);
  roster.Admit(Fresh(msg::Role::Worker, "w1"), -1, 0);
  const absl::Time t0 = absl::Now();
  roster.Form(t0);
  roster.Find(msg::Role::Worker, 0)->last_seen = t0 + kDead;
  roster.Find(msg::Role::Server, 0)->last_seen = t0 + kDead;
  const std::vector<Roster::Node*> dead = roster.DeclareSilentDead(t0 + kDead + absl::Seconds(1));
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0]->route, "w1");
  EXPECT_EQ(roster.DeadWorker(), dead[0]);
  EXPECT_EQ(roster.DeadNodes(), "Worker 1");
  EXPECT_EQ(roster.AliveWorkers(), 1);
  const absl::Status told = roster.FromHeartbeat(msg::Role::Worker, 1, "w1").status();
  EXPECT_EQ(told.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(told.message(), HasSubstr("declared dead after 30s"));
  const SchedulerMetrics::NodeCounts counts = roster.Counts(msg::Role::Worker);
  EXPECT_EQ(counts.live, 1);
  EXPECT_EQ(counts.dead, 1);
}

TEST(Roster, AJobThatDoesNotReFormInTimeAfterARestartNamesWhoNeverCameBack) {
  Roster roster(2, 2, 0, kDead, absl::Seconds(10));
  const absl::Time t0 = absl::Now();
  // A fresh job: no deadline, however long it takes.
  roster.Admit(Fresh(msg::Role::Server, "fresh"), -1, 0);
  EXPECT_TRUE(roster.Reforming(t0 + absl::Hours(1)).ok());
  // A node that had rank 1 before the scheduler restarted: the job re-forms from now on.
  roster.NoteReformingNode(t0);
  roster.Admit(Fresh(msg::Role::Worker, "w1"), 1, 0);
  roster.NoteReformingNode(t0 + absl::Seconds(5));  // the deadline counts from the first
  EXPECT_TRUE(roster.Reforming(t0 + absl::Seconds(10)).ok());
  const absl::Status late = roster.Reforming(t0 + absl::Seconds(11));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late.message(), HasSubstr("2 of 4 nodes"));
  EXPECT_THAT(late.message(), HasSubstr("never came back: server 1, worker 0"));
  // Once every node is back and the job formed, no deadline is left.
  roster.Admit(Fresh(msg::Role::Server, "s1"), 1, 0);
  roster.Admit(Fresh(msg::Role::Worker, "w0"), 0, 0);
  roster.Form(t0 + absl::Seconds(12));
  EXPECT_TRUE(roster.Reforming(t0 + absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace adaps
