// The cluster client against a real in-process Scheduler: registration, views, forged
// messages, a scheduler restart, a lost scheduler, shutdown.
#include "common/cluster_client.h"

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"

namespace adaps {
namespace {

// One node: a transport (with a ROUTER for servers) and its cluster client, counting what
// the callbacks saw.
class Node {
 public:
  Node(std::shared_ptr<TransportContext> context, msg::Role role, const std::string& scheduler,
       absl::Duration grace = absl::Seconds(60), std::string identity = "")
      : log_(role == msg::Role::Server ? "server" : "worker", "warn") {
    TransportOptions t;
    t.self = Sender{role, -1};
    t.context = std::move(context);
    static std::atomic<int> next{0};
    if (role == msg::Role::Server) bind_ = absl::StrCat("inproc://ccnode", next.fetch_add(1));
    t.bind_endpoint = bind_;
    transport_ = std::make_unique<Transport>(std::move(t), [this](InMessage in) {
      if (!client_->Handle(in)) other_.fetch_add(1);
    });
    ClusterClientOptions o;
    o.scheduler = scheduler;
    o.address = bind_;
    o.identity = std::move(identity);
    o.register_timeout = absl::Seconds(10);
    o.scheduler_grace = grace;
    ClusterClient::Callbacks cb;
    cb.on_view = [this](const msg::ClusterView& v) {
      views_.fetch_add(1);
      last_rank_.store(v.your_rank());
    };
    cb.on_shutdown = [this](const absl::Status& s) {
      absl::MutexLock lock(&mu_);
      shutdowns_++;
      shutdown_ = s;
    };
    client_ = std::make_unique<ClusterClient>(*transport_, log_, o, cb);
  }
  ~Node() { transport_->Stop(); }

  absl::Status Start() { return transport_->Start(); }
  absl::StatusOr<InMessage> Register() { return client_->Register(); }
  bool WaitShutdown(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdowns_ > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  absl::Status shutdown_status() {
    absl::MutexLock lock(&mu_);
    return shutdown_;
  }
  int shutdowns() {
    absl::MutexLock lock(&mu_);
    return shutdowns_;
  }

  RoleLog log_;
  std::string bind_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<ClusterClient> client_;
  std::atomic<int> views_{0};
  std::atomic<int> last_rank_{-2};
  std::atomic<int> other_{0};
  absl::Mutex mu_;
  int shutdowns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status shutdown_ ABSL_GUARDED_BY(mu_);
};

SchedulerConfig SmallCluster(const std::string& bind) {
  SchedulerConfig sc;
  sc.bind = bind;
  sc.num_servers = 1;
  sc.num_workers = 1;
  sc.heartbeat_interval = absl::Milliseconds(100);
  sc.dead_timeout = absl::Seconds(5);
  sc.log_level = "warn";
  return sc;
}

// Registers both nodes concurrently (the view comes once both are in).
void RegisterBoth(Node& a, Node& b) {
  absl::StatusOr<InMessage> ra, rb;
  std::thread t([&] { ra = a.Register(); });
  rb = b.Register();
  t.join();
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
}

bool Eventually(const std::function<bool()>& cond, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return cond();
}

TEST(ClusterClient, RegistersAndLearnsItsRankFromTheView) {
  auto ctx = std::make_shared<TransportContext>(1);
  Scheduler scheduler(SmallCluster("inproc://cc-sched1"), ctx);
  ASSERT_TRUE(scheduler.Start().ok());
  Node server(ctx, msg::Role::Server, "inproc://cc-sched1");
  Node worker(ctx, msg::Role::Worker, "inproc://cc-sched1");
  ASSERT_TRUE(server.Start().ok());
  ASSERT_TRUE(worker.Start().ok());
  RegisterBoth(server, worker);
  EXPECT_EQ(server.transport_->rank(), 0);
  EXPECT_EQ(worker.transport_->rank(), 0);
  EXPECT_GE(server.views_.load(), 1);
  EXPECT_GT(server.client_->epoch(), 0u);
  EXPECT_EQ(server.client_->scheduler_peer(), 0);
}

TEST(ClusterClient, ForgedViewAndShutdownAreRefusedAndNeverPassedOn) {
  auto ctx = std::make_shared<TransportContext>(1);
  Scheduler scheduler(SmallCluster("inproc://cc-sched2"), ctx);
  ASSERT_TRUE(scheduler.Start().ok());
  Node server(ctx, msg::Role::Server, "inproc://cc-sched2");
  Node worker(ctx, msg::Role::Worker, "inproc://cc-sched2");
  ASSERT_TRUE(server.Start().ok());
  ASSERT_TRUE(worker.Start().ok());
  RegisterBoth(server, worker);
  const int views = server.views_.load();

  // A stranger connects to the server's ROUTER and claims to be the scheduler.
  TransportOptions t;
  t.self = Sender{msg::Role::Scheduler, 0};
  t.context = ctx;
  Transport rogue(std::move(t), [](InMessage) {});
  ASSERT_TRUE(rogue.Start().ok());
  auto peer = rogue.Connect(server.bind_);
  ASSERT_TRUE(peer.ok());
  std::vector<absl::Status> answers;
  for (int kind = 0; kind < 2; ++kind) {
    flatbuffers::FlatBufferBuilder fbb(256);
    const uint64_t id = rogue.NewRequestId();
    OutMessage m;
    if (kind == 0) {
      auto body = msg::CreateClusterView(fbb, 0, 1, 1, 999, fbb.CreateVector(
                                             std::vector<flatbuffers::Offset<msg::NodeInfo>>{}));
      m = FinishEnvelope(fbb, rogue.self(), body, id, 0);
    } else {
      auto body = msg::CreateShutdown(fbb, fbb.CreateString("forged"), 10);
      m = FinishEnvelope(fbb, rogue.self(), body, id, 0);
    }
    std::promise<absl::Status> p;
    auto f = p.get_future();
    rogue.Request(*peer, id, std::move(m), absl::Now() + absl::Seconds(5),
                  [&p](absl::StatusOr<InMessage> r) { p.set_value(r.status()); });
    answers.push_back(f.get());
  }
  for (const auto& a : answers) EXPECT_EQ(a.code(), absl::StatusCode::kPermissionDenied) << a;
  EXPECT_EQ(server.client_->refused(), 2u);
  EXPECT_EQ(server.views_.load(), views);
  EXPECT_LT(server.client_->epoch(), 999u);
  EXPECT_EQ(server.shutdowns(), 0);
  rogue.Stop();
}

TEST(ClusterClient, SchedulerRestartLeadsToReregistrationWithTheSameRanks) {
  auto ctx = std::make_shared<TransportContext>(1);
  auto first = std::make_unique<Scheduler>(SmallCluster("tcp://127.0.0.1:0"), ctx);
  ASSERT_TRUE(first->Start().ok());
  const std::string endpoint = first->endpoint();
  Node server(ctx, msg::Role::Server, endpoint);
  Node worker(ctx, msg::Role::Worker, endpoint);
  ASSERT_TRUE(server.Start().ok());
  ASSERT_TRUE(worker.Start().ok());
  RegisterBoth(server, worker);
  const uint32_t epoch = server.client_->epoch();
  const int views = worker.views_.load();

  first->Stop();
  first.reset();
  // The old socket closes asynchronously (linger): retry the bind for a moment.
  std::unique_ptr<Scheduler> second;
  ASSERT_TRUE(Eventually(
      [&] {
        second = std::make_unique<Scheduler>(SmallCluster(endpoint), ctx);
        return second->Start().ok();
      },
      absl::Seconds(5)))
      << "port " << endpoint << " not free again";
  // Heartbeats are refused by the new scheduler; both nodes register again and the
  // cluster re-forms with the ranks they had and a larger epoch.
  EXPECT_TRUE(Eventually(
      [&] { return worker.views_.load() > views && server.client_->epoch() > epoch; },
      absl::Seconds(10)));
  EXPECT_EQ(worker.last_rank_.load(), 0);
  EXPECT_EQ(server.transport_->rank(), 0);
  EXPECT_EQ(server.shutdowns(), 0);
  EXPECT_EQ(worker.shutdowns(), 0);
}

TEST(ClusterClient, LostSchedulerEndsEveryRoleAfterTheGracePeriod) {
  auto ctx = std::make_shared<TransportContext>(1);
  auto scheduler = std::make_unique<Scheduler>(SmallCluster("inproc://cc-sched4"), ctx);
  ASSERT_TRUE(scheduler->Start().ok());
  Node server(ctx, msg::Role::Server, "inproc://cc-sched4", absl::Milliseconds(600));
  Node worker(ctx, msg::Role::Worker, "inproc://cc-sched4", absl::Milliseconds(600));
  ASSERT_TRUE(server.Start().ok());
  ASSERT_TRUE(worker.Start().ok());
  RegisterBoth(server, worker);
  absl::SleepFor(absl::Milliseconds(900));  // heartbeats answered: no give-up
  EXPECT_EQ(server.shutdowns(), 0);
  const absl::Time lost = absl::Now();
  scheduler->Stop();
  ASSERT_TRUE(server.WaitShutdown(absl::Seconds(5)));
  ASSERT_TRUE(worker.WaitShutdown(absl::Seconds(5)));
  EXPECT_GE(absl::Now() - lost, absl::Milliseconds(400));
  EXPECT_EQ(server.shutdown_status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(worker.shutdown_status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(worker.shutdown_status().message().find("inproc://cc-sched4"), std::string::npos);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(server.shutdowns(), 1);  // once
}

TEST(ClusterClient, WorkerLeavingEndsTheServerWithACleanShutdown) {
  auto ctx = std::make_shared<TransportContext>(1);
  Scheduler scheduler(SmallCluster("inproc://cc-sched5"), ctx);
  ASSERT_TRUE(scheduler.Start().ok());
  Node server(ctx, msg::Role::Server, "inproc://cc-sched5");
  Node worker(ctx, msg::Role::Worker, "inproc://cc-sched5");
  ASSERT_TRUE(server.Start().ok());
  ASSERT_TRUE(worker.Start().ok());
  RegisterBoth(server, worker);
  EXPECT_TRUE(worker.client_->Leave(absl::Seconds(5)).ok());
  ASSERT_TRUE(server.WaitShutdown(absl::Seconds(5)));
  EXPECT_TRUE(server.shutdown_status().ok()) << server.shutdown_status();
  EXPECT_TRUE(worker.client_->Leave(absl::Seconds(1)).ok());  // idempotent
}

TEST(ClusterClient, ShutdownStatusKeepsTheSchedulersCodeAndReason) {
  flatbuffers::FlatBufferBuilder fbb(128);
  fbb.Finish(msg::CreateShutdown(fbb, fbb.CreateString("worker 2 died"),
                                 static_cast<int>(absl::StatusCode::kAborted)));
  const auto* sd = flatbuffers::GetRoot<msg::Shutdown>(fbb.GetBufferPointer());
  absl::Status s = ShutdownStatus(*sd);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_NE(s.message().find("worker 2 died"), std::string::npos);

  flatbuffers::FlatBufferBuilder clean(128);
  clean.Finish(msg::CreateShutdown(clean, clean.CreateString("done"), 0));
  EXPECT_TRUE(ShutdownStatus(*flatbuffers::GetRoot<msg::Shutdown>(clean.GetBufferPointer())).ok());
  flatbuffers::FlatBufferBuilder bad(128);
  bad.Finish(msg::CreateShutdown(bad, bad.CreateString("?"), 9999));
  EXPECT_TRUE(ShutdownStatus(*flatbuffers::GetRoot<msg::Shutdown>(bad.GetBufferPointer())).ok());
}

TEST(ClusterClient, UnreachableSchedulerFailsAtTheDeadlineNamingTheAddress) {
  auto ctx = std::make_shared<TransportContext>(1);
  TransportOptions t;
  t.self = Sender{msg::Role::Worker, -1};
  t.context = ctx;
  Transport transport(std::move(t), [](InMessage) {});
  RoleLog log("worker", "off");
  ClusterClientOptions o;
  o.scheduler = "inproc://nobody-here";
  o.register_timeout = absl::Milliseconds(300);
  ClusterClient client(transport, log, o, {});
  ASSERT_TRUE(transport.Start().ok());
  const absl::Time start = absl::Now();
  auto r = client.Register();
  EXPECT_FALSE(r.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_NE(r.status().message().find("inproc://nobody-here"), std::string::npos) << r.status();
  transport.Stop();
}

// A port nobody listens on (bound, then closed).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(ProbeEndpoint, NamesTheCauseOfAnUnreachableAddress) {
  const std::string refused = absl::StrCat("tcp://127.0.0.1:", FreePort());
  EXPECT_EQ(ProbeEndpoint(refused, absl::Seconds(1)), "connection refused");
  EXPECT_THAT(ProbeEndpoint("tcp://no-such-host.invalid:5510", absl::Seconds(1)),
              ::testing::HasSubstr("unknown host 'no-such-host.invalid'"));
  EXPECT_EQ(ProbeEndpoint("inproc://x", absl::Seconds(1)), "");
  auto ctx = std::make_shared<TransportContext>(1);
  Scheduler scheduler(SmallCluster("tcp://127.0.0.1:0"), ctx);
  ASSERT_TRUE(scheduler.Start().ok());
  EXPECT_EQ(ProbeEndpoint(scheduler.endpoint(), absl::Seconds(1)), "");
}

TEST(ClusterClient, RefusedSchedulerIsReportedWithTheCauseAtTheDeadline) {
  auto ctx = std::make_shared<TransportContext>(1);
  TransportOptions t;
  t.self = Sender{msg::Role::Worker, -1};
  t.context = ctx;
  Transport transport(std::move(t), [](InMessage) {});
  RoleLog log("worker", "off");
  ClusterClientOptions o;
  o.scheduler = absl::StrCat("tcp://127.0.0.1:", FreePort());
  o.register_timeout = absl::Milliseconds(1500);
  ClusterClient client(transport, log, o, {});
  ASSERT_TRUE(transport.Start().ok());
  auto r = client.Register();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              ::testing::HasSubstr(o.scheduler + " not reachable: connection refused"));
  transport.Stop();
}

}  // namespace
}  // namespace adaps
