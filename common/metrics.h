// Live metrics of an adaps process: a small adaps-facing layer over prometheus-cpp.
//
// One Metrics object per process (made in main() from --metrics_port and handed to the
// role objects). Enabled, it serves the Prometheus text format on
// http://<host>:<port>/metrics through prometheus-cpp's Exposer (a civetweb server with its
// own threads, owned by the Metrics object: started by Create, stopped by the destructor).
// Disabled (the default: no port), it serves nothing and every handle it gives out is a
// no-op that costs one predictable branch.
//
// Names and labels: every metric adaps exports is listed once below (metric_names, and
// kMetricCatalog with its type, help and label names), so that the scheduler, servers and
// workers spell them alike and docs/operations.md and deploy/grafana/adaps.json can be
// checked against one list. Every series also carries the constant labels `role` and
// `rank` of the process (MetricsOptions). Seconds and bytes are the base units.
//
// Handles (Counter, Gauge, Histogram) are small values that point into the registry; get
// them once (at setup, or per tensor when it is declared) and keep them: a lookup takes a
// lock, an update through a handle is a lock-free atomic operation. Handles stay valid
// while their Metrics lives.
//
// Thread-safety: all methods and handles are thread-safe.
#ifndef ADAPS_COMMON_METRICS_H_
#define ADAPS_COMMON_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
class Exposer;
}  // namespace prometheus

namespace adaps {

// The metric names of the whole system. See kMetricCatalog for types, labels and help, and
// docs/operations.md for what each one means to an operator.
namespace metric_names {
// Worker, per tensor (label tensor).
inline constexpr char kPushesTotal[] = "adaps_pushes_total";
inline constexpr char kPullsTotal[] = "adaps_pulls_total";
inline constexpr char kPushBytesTotal[] = "adaps_push_bytes_total";  // wire bytes sent
inline constexpr char kPushDenseBytesTotal[] = "adaps_push_dense_bytes_total";  // uncompressed
inline constexpr char kPullBytesTotal[] = "adaps_pull_bytes_total";  // wire bytes received
inline constexpr char kPullDenseBytesTotal[] = "adaps_pull_dense_bytes_total";
inline constexpr char kCompressionRatio[] = "adaps_compression_ratio";  // dense/wire, last push
inline constexpr char kDensity[] = "adaps_density";  // fraction of elements sent, last push
// Worker, per step.
inline constexpr char kStepsTotal[] = "adaps_steps_total";
inline constexpr char kStepSeconds[] = "adaps_step_seconds";
inline constexpr char kStepPhaseSeconds[] = "adaps_step_phase_seconds";  // label phase
// Server, per tensor slice it holds (label tensor; the server's rank is the shard).
inline constexpr char kServerPushesTotal[] = "adaps_server_pushes_total";
inline constexpr char kServerPullsTotal[] = "adaps_server_pulls_total";
inline constexpr char kServerPushBytesTotal[] = "adaps_server_push_bytes_total";
inline constexpr char kServerPullBytesTotal[] = "adaps_server_pull_bytes_total";
inline constexpr char kServerPushDenseBytesTotal[] = "adaps_server_push_dense_bytes_total";
inline constexpr char kServerPullDenseBytesTotal[] = "adaps_server_pull_dense_bytes_total";
// The pull answers by the format the server chose (a sparse pull: sparse or dense).
inline constexpr char kServerPullAnswersTotal[] = "adaps_server_pull_answers_total";
inline constexpr char kServerPullAnswerBytesTotal[] = "adaps_server_pull_answer_bytes_total";
inline constexpr char kServerStepsTotal[] = "adaps_server_steps_total";  // sync steps completed
inline constexpr char kServerWorkSeconds[] = "adaps_server_work_seconds";  // label op
// Per completed step of a slice: decode-add of every push + optimizer + publish (label tensor).
inline constexpr char kServerStepWorkSeconds[] = "adaps_server_step_work_seconds";
inline constexpr char kServerLiveWorkers[] = "adaps_server_live_workers";
inline constexpr char kCheckpointAgeSeconds[] = "adaps_checkpoint_age_seconds";
inline constexpr char kCheckpointsTotal[] = "adaps_checkpoints_total";
// Scheduler.
inline constexpr char kNodes[] = "adaps_nodes";                   // labels node_role, state
inline constexpr char kNodesExpected[] = "adaps_nodes_expected";  // label node_role
inline constexpr char kRegistrationsTotal[] = "adaps_registrations_total";  // label node_role
inline constexpr char kViewsSentTotal[] = "adaps_views_sent_total";
inline constexpr char kClusterEpoch[] = "adaps_cluster_epoch";
inline constexpr char kClusterFormed[] = "adaps_cluster_formed";
inline constexpr char kLostResidueNormTotal[] = "adaps_lost_residue_norm_total";
// Every role.
inline constexpr char kRejectedMessagesTotal[] = "adaps_rejected_messages_total";  // reason
inline constexpr char kTransportMessagesTotal[] = "adaps_transport_messages_total";  // direction
inline constexpr char kTransportBytesTotal[] = "adaps_transport_bytes_total";  // direction
}  // namespace metric_names

// Label names and the fixed values some of them take.
namespace metric_labels {
inline constexpr char kTensor[] = "tensor";
inline constexpr char kPhase[] = "phase";  // kPhase* values
inline constexpr char kOp[] = "op";        // push, pull, step
inline constexpr char kNodeRole[] = "node_role";  // server, worker
inline constexpr char kFormat[] = "format";  // dense, recompressed, replica, sparse
inline constexpr char kState[] = "state";         // live, dead, left
inline constexpr char kReason[] = "reason";       // kReason* values
inline constexpr char kDirection[] = "direction";  // in, out

inline constexpr char kPhaseCompress[] = "compress";
inline constexpr char kPhaseWait[] = "wait";
inline constexpr char kPhaseDecode[] = "decode";

// Why a message was refused. Transport level: failed verification or frame checks, or
// another protocol version (TransportStats::dropped_invalid).
inline constexpr char kReasonMalformed[] = "malformed";
// Protocol level (the receiver answered with an Error).
inline constexpr char kReasonUnsupported[] = "unsupported";    // body this role does not handle
inline constexpr char kReasonUnknownNode[] = "unknown_node";   // sender not (or no longer) known
inline constexpr char kReasonClusterFull[] = "cluster_full";   // register past the counts
inline constexpr char kReasonNotFormed[] = "not_formed";       // request before the cluster formed
inline constexpr char kReasonInvalid[] = "invalid_argument";   // a field failed validation
inline constexpr char kReasonForbidden[] = "forbidden";  // a control message from a node not allowed to send it
// Server: a push or pull out of order (another step, a second push, a replica too old).
inline constexpr char kReasonFailedPrecondition[] = "failed_precondition";
inline constexpr char kReasonTooLarge[] = "too_large";  // a slice past --max_slice_elements
}  // namespace metric_labels

enum class MetricType { kCounter, kGauge, kHistogram };

struct MetricInfo {
  const char* name;
  MetricType type;
  const char* help;
  std::vector<const char*> labels;  // besides the constant role and rank
};

// Every metric adaps exports, with the label names each one takes (in this order).
const std::vector<MetricInfo>& MetricCatalog();

// Seconds buckets of the duration histograms: 100 us to about 26 s, factor 2.
std::vector<double> DefaultSecondsBuckets();

using MetricLabels = std::map<std::string, std::string>;

class Counter {
 public:
  Counter() = default;  // a no-op
  void Increment(double by = 1) {
    if (counter_ != nullptr) IncrementImpl(by);
  }
  double Value() const;  // 0 for a no-op handle
  bool enabled() const { return counter_ != nullptr; }

 private:
  friend class Metrics;
  explicit Counter(prometheus::Counter* c) : counter_(c) {}
  void IncrementImpl(double by);
  prometheus::Counter* counter_ = nullptr;
};

class Gauge {
 public:
  Gauge() = default;  // a no-op
  void Set(double value) {
    if (gauge_ != nullptr) SetImpl(value);
  }
  void Increment(double by = 1) {
    if (gauge_ != nullptr) IncrementImpl(by);
  }
  double Value() const;
  bool enabled() const { return gauge_ != nullptr; }

 private:
  friend class Metrics;
  explicit Gauge(prometheus::Gauge* g) : gauge_(g) {}
  void SetImpl(double value);
  void IncrementImpl(double by);
  prometheus::Gauge* gauge_ = nullptr;
};

class Histogram {
 public:
  Histogram() = default;  // a no-op
  void Observe(double value) {
    if (histogram_ != nullptr) ObserveImpl(value);
  }
  bool enabled() const { return histogram_ != nullptr; }

 private:
  friend class Metrics;
  explicit Histogram(prometheus::Histogram* h) : histogram_(h) {}
  void ObserveImpl(double value);
  prometheus::Histogram* histogram_ = nullptr;
};

struct MetricsOptions {
  int port = -1;                 // < 0: disabled; 0: the OS picks (see Metrics::port())
  std::string host = "0.0.0.0";  // address the HTTP endpoint listens on
  std::string port_file;         // when set, the real port is written here once listening
  std::string role;              // constant label role (scheduler, server, worker)
  int rank = 0;                  // constant label rank (the shard, for a server)
};

class Metrics {
 public:
  // Starts serving /metrics when options.port >= 0. kInvalidArgument for a port above
  // 65535 or an empty role; kUnavailable when the port cannot be bound (in use) or the
  // port file cannot be written. Never throws.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const MetricsOptions& options);
  // A Metrics that serves nothing and hands out no-op handles.
  static std::unique_ptr<Metrics> Disabled();
  ~Metrics();  // stops the HTTP server
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  bool enabled() const { return registry_ != nullptr; }
  int port() const { return port_; }  // the real port; 0 when disabled

  // Sets the constant label rank of every series made from now on. For the servers and
  // workers, whose rank the scheduler assigns after the endpoint must already answer
  // (probes): call it once the rank is known and before the first Get*. kFailedPrecondition
  // once a series exists (its rank label is fixed); the rank is then unchanged.
  absl::Status SetRank(int rank);

  // A handle to the series `name`{labels}. `name` must be in MetricCatalog() with that type
  // and `labels` must name exactly its label names; otherwise (a programming error, caught
  // by tests) the handle is a no-op and status() reports the first such mistake. A disabled
  // Metrics checks the same and returns no-op handles.
  Counter GetCounter(absl::string_view name, const MetricLabels& labels = {});
  Gauge GetGauge(absl::string_view name, const MetricLabels& labels = {});
  Histogram GetHistogram(absl::string_view name, const MetricLabels& labels = {});

  // OK, or the first GetCounter/GetGauge/GetHistogram call that did not match the catalog.
  absl::Status status() const;

  // The Prometheus text exposition of every series (what /metrics serves); empty when
  // disabled. For tests and logs.
  std::string Scrape() const;

 private:
  struct Families;
  mutable absl::Mutex mu_;  // first: rank_ below is guarded by it
  Metrics(MetricsOptions options, std::shared_ptr<prometheus::Registry> registry);
  // The catalog entry of `name` when it has `type` and `labels` fit; else records why.
  const MetricInfo* Check(absl::string_view name, MetricType type, const MetricLabels& labels);

  const MetricsOptions options_;
  int rank_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<prometheus::Registry> registry_;  // null: disabled
  std::unique_ptr<Families> families_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaps

#endif  // ADAPS_COMMON_METRICS_H_
