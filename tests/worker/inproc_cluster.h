// The scheduler and servers of an in-process cluster for the worker tests: inproc://
// endpoints on one shared TransportContext; the test makes its worker (Worker::Create or
// Worker::Impl) against kScheduler between Start() and JoinServers(), since a server's
// Start returns only once the cluster formed.
#ifndef ADAPS_TESTS_WORKER_INPROC_CLUSTER_H_
#define ADAPS_TESTS_WORKER_INPROC_CLUSTER_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/optimizer.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/server.h"

namespace adaps {
namespace testing {

struct InprocServersOptions {
  int servers = 2;
  int workers = 1;  // each made by the test on a thread of its own (Create waits for all)
  uint64_t split_threshold = 1 << 16;  // the scheduler's default
  OptimizerConfig optimizer{OptimizerKind::kSumOnly};
  std::vector<Metrics*> metrics;  // one per server when given
};

class InprocServers {
 public:
  static constexpr const char* kScheduler = "inproc://scheduler";

  // Starts the scheduler, then each server's Start on a thread of its own.
  absl::Status Start(const InprocServersOptions& o) {
    context_ = std::make_shared<TransportContext>(1);
    SchedulerConfig sc;
    sc.bind = kScheduler;
    sc.num_servers = o.servers;
    sc.num_workers = o.workers;
    sc.split_threshold = o.split_threshold;
    sc.heartbeat_interval = absl::Milliseconds(100);
    sc.dead_timeout = absl::Seconds(5);
    sc.log_level = "warn";
    scheduler_ = std::make_unique<Scheduler>(sc, context_);
    if (absl::Status s = scheduler_->Start(); !s.ok()) return s;
    status_.resize(o.servers);
    for (int s = 0; s < o.servers; ++s) {
      ServerConfig vc;
      vc.scheduler = kScheduler;
      vc.bind = "inproc://server" + std::to_string(s);
      vc.optimizer = o.optimizer;
      vc.log_level = "warn";
      Metrics* m = s < static_cast<int>(o.metrics.size()) ? o.metrics[s] : nullptr;
      servers_.push_back(std::make_unique<Server>(vc, context_, m));
    }
    for (int s = 0; s < o.servers; ++s) {
      starts_.emplace_back([this, s] { status_[s] = servers_[s]->Start(); });
    }
    return absl::OkStatus();
  }

  // After the worker was made: the servers' Start results (the first error).
  absl::Status JoinServers() {
    for (auto& t : starts_) t.join();
    starts_.clear();
    for (const absl::Status& st : status_) {
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<TransportContext>& context() const { return context_; }

  // Stop the worker first: the scheduler and the servers end when it left.
  ~InprocServers() {
    for (auto& t : starts_) t.join();
    if (scheduler_) {
      EXPECT_TRUE(scheduler_->WaitForShutdown(absl::Seconds(5)));
    }
    for (auto& s : servers_) EXPECT_TRUE(s->WaitForShutdown(absl::Seconds(5)));
  }

 private:
  std::shared_ptr<TransportContext> context_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::thread> starts_;
  std::vector<absl::Status> status_;
};

}  // namespace testing
}  // namespace adaps

#endif  // ADAPS_TESTS_WORKER_INPROC_CLUSTER_H_
