// The scheduler's configuration (adaps-scheduler builds it from defaults < file < ADAPS_*
// environment < flags, scheduler/main.cc) and its check.
#ifndef ADAPS_SCHEDULER_SCHEDULER_CONFIG_H_
#define ADAPS_SCHEDULER_SCHEDULER_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/config.h"

namespace adaps {

struct SchedulerConfig {
  std::string bind = "tcp://127.0.0.1:0";  // port 0: the OS picks; see endpoint()
  int num_servers = 1;
  int num_workers = 1;  // the workers the job starts with (it forms when they are in)
  // The most live workers at once: workers that register after the job started (a new
  // identity, not a restart) are admitted while fewer are live (elastic membership,
  // docs/reliability.md "Workers that join"). 0: num_workers (nobody joins).
  int max_workers = 0;
  absl::Duration heartbeat_interval = absl::Seconds(1);  // told to every node
  absl::Duration dead_timeout = absl::Seconds(30);       // silent this long: dead
  // A restarted scheduler (a node registers with the rank it had before) waits this long,
  // from the first node back, for every node of the job; then it stops the nodes that came
  // back and ends with kDeadlineExceeded naming the missing ones.
  absl::Duration reform_timeout = absl::Minutes(5);
  // Goodbyes (Leave) within this long of the last view share one view broadcast: a view
  // goes to every node and grows with the job, so one per goodbye at a job's end is
  // nodes^2 x goodbyes bytes (32 nodes on 1 Mbit/s links: seconds). The first goodbye after a
  // quiet spell is told at once.
  absl::Duration leave_view_window = absl::Milliseconds(250);
  // Tensors with at least this many elements are split over all servers; smaller ones go
  // whole to the least-loaded server.
  uint64_t split_threshold = 1 << 16;
  // What a worker declared dead means: the others continue (sync steps average over the
  // live workers), or the whole cluster stops with an ABORTED shutdown naming the worker.
  enum class OnWorkerDeath { kContinue, kFail };
  OnWorkerDeath on_worker_death = OnWorkerDeath::kContinue;
  CurveKeys curve;  // enabled: only allowed_clients may connect (common/config.h)
  // What an operator's Shutdown request must carry; empty: Shutdown requests are refused.
  std::string admin_token;
  // The job's identity, sent in every ClusterView; servers write it into their checkpoints
  // and restore only a checkpoint of the same job. Empty: a random id made at start (give
  // one to resume a job after restarting the scheduler or the whole cluster).
  std::string job_id;
  std::string log_level = "info";
};

// kInvalidArgument naming the bad field.
absl::Status ValidateSchedulerConfig(const SchedulerConfig& config);

}  // namespace adaps

#endif  // ADAPS_SCHEDULER_SCHEDULER_CONFIG_H_
