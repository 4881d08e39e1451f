// The scheduler's live metrics (common/metrics.h): nodes by role and state, registrations,
// views sent, the cluster epoch, rejected messages by reason and the transport's traffic.
//
// Owned by the Scheduler and used only on its transport's I/O thread. With a disabled
// Metrics every update is a no-op.
#ifndef ADAPS_SCHEDULER_SCHEDULER_METRICS_H_
#define ADAPS_SCHEDULER_SCHEDULER_METRICS_H_

#include <cstdint>
#include <map>
#include <tuple>
#include <string>

#include "common/messages.h"
#include "common/metrics.h"
#include "common/transport.h"

namespace adaps {

class SchedulerMetrics {
 public:
  // `metrics` must outlive this object.
  SchedulerMetrics(Metrics& metrics, int num_servers, int num_workers);

  struct NodeCounts {
    int live = 0;
    int dead = 0;
    int left = 0;
  };
  // The nodes the scheduler knows of one role (server or worker) now.
  void SetNodes(msg::Role role, const NodeCounts& counts);
  void Registered(msg::Role role);
  void ViewSent(uint32_t epoch);
  void Formed() { formed_.Set(1); }
  // A worker declared dead took this much residue (L2 norm) with it.
  void LostResidue(double norm) { lost_residue_.Increment(norm); }
  // `reason`: a metric_labels::kReason* value.
  void Rejected(const char* reason);
  // Adds what the transport counted since the last call (drops become "malformed").
  void UpdateTransport(const TransportStats& now);

 private:
  struct RoleGauges {
    Gauge live, dead, left;
    Counter registrations;
  };
  RoleGauges& For(msg::Role role) { return role == msg::Role::Server ? servers_ : workers_; }

  Metrics& metrics_;
  RoleGauges servers_;
  RoleGauges workers_;
  Counter views_sent_;
  Gauge epoch_;
  Gauge formed_;
  Counter lost_residue_;
  std::map<std::string, Counter> rejected_;
  Counter messages_in_, messages_out_, bytes_in_, bytes_out_;
  TransportStats last_;
};

}  // namespace adaps

#endif  // ADAPS_SCHEDULER_SCHEDULER_METRICS_H_
