#include "scheduler/scheduler_metrics.h"

namespace adaps {

namespace n = metric_names;
namespace l = metric_labels;

SchedulerMetrics::SchedulerMetrics(Metrics& metrics, int num_servers, int num_workers)
    : metrics_(metrics) {
  for (auto [role, name, expected] : {std::tuple{msg::Role::Server, "server", num_servers},
                                      std::tuple{msg::Role::Worker, "worker", num_workers}}) {
    RoleGauges& g = For(role);
    g.live = metrics.GetGauge(n::kNodes, {{l::kNodeRole, name}, {l::kState, "live"}});
    g.dead = metrics.GetGauge(n::kNodes, {{l::kNodeRole, name}, {l::kState, "dead"}});
    g.left = metrics.GetGauge(n::kNodes, {{l::kNodeRole, name}, {l::kState, "left"}});
    g.registrations = metrics.GetCounter(n::kRegistrationsTotal, {{l::kNodeRole, name}});
    metrics.GetGauge(n::kNodesExpected, {{l::kNodeRole, name}}).Set(expected);
  }
  views_sent_ = metrics.GetCounter(n::kViewsSentTotal);
  epoch_ = metrics.GetGauge(n::kClusterEpoch);
  formed_ = metrics.GetGauge(n::kClusterFormed);
  formed_.Set(0);
  lost_residue_ = metrics.GetCounter(n::kLostResidueNormTotal);
  // Every reason the scheduler gives exists from the start, so that rate() and alerts see
  // the first rejection as an increase from 0.
  for (const char* reason : {l::kReasonMalformed, l::kReasonUnsupported, l::kReasonUnknownNode,
                             l::kReasonClusterFull, l::kReasonNotFormed, l::kReasonInvalid}) {
    rejected_[reason] = metrics.GetCounter(n::kRejectedMessagesTotal, {{l::kReason, reason}});
  }
  messages_in_ = metrics.GetCounter(n::kTransportMessagesTotal, {{l::kDirection, "in"}});
  messages_out_ = metrics.GetCounter(n::kTransportMessagesTotal, {{l::kDirection, "out"}});
  bytes_in_ = metrics.GetCounter(n::kTransportBytesTotal, {{l::kDirection, "in"}});
  bytes_out_ = metrics.GetCounter(n::kTransportBytesTotal, {{l::kDirection, "out"}});
}

void SchedulerMetrics::SetNodes(msg::Role role, const NodeCounts& counts) {
  RoleGauges& g = For(role);
  g.live.Set(counts.live);
  g.dead.Set(counts.dead);
  g.left.Set(counts.left);
}

void SchedulerMetrics::Registered(msg::Role role) { For(role).registrations.Increment(); }

void SchedulerMetrics::ViewSent(uint32_t epoch) {
  views_sent_.Increment();
  epoch_.Set(epoch);
}

void SchedulerMetrics::Rejected(const char* reason) {
  auto it = rejected_.find(reason);
  if (it == rejected_.end()) {
    it = rejected_.emplace(reason, metrics_.GetCounter(n::kRejectedMessagesTotal,
                                                       {{l::kReason, reason}}))
             .first;
  }
  it->second.Increment();
}

void SchedulerMetrics::UpdateTransport(const TransportStats& now) {
  // The transport's counters only grow; a smaller value would be a new transport.
  auto delta = [](uint64_t now, uint64_t before) {
    return now >= before ? static_cast<double>(now - before) : 0.0;
  };
  rejected_[l::kReasonMalformed].Increment(delta(now.dropped_invalid, last_.dropped_invalid));
  messages_in_.Increment(delta(now.messages_in, last_.messages_in));
  messages_out_.Increment(delta(now.messages_out, last_.messages_out));
  bytes_in_.Increment(delta(now.bytes_in, last_.bytes_in));
  bytes_out_.Increment(delta(now.bytes_out, last_.bytes_out));
  last_ = now;
}

}  // namespace adaps
