#include "common/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace adaps {

namespace n = metric_names;
namespace l = metric_labels;

const std::vector<MetricInfo>& MetricCatalog() {
  using T = MetricType;
  static const auto* catalog = new std::vector<MetricInfo>{
      {n::kPushesTotal, T::kCounter, "Gradient pushes sent, per tensor", {l::kTensor}},
      {n::kPullsTotal, T::kCounter, "Parameter pulls answered, per tensor", {l::kTensor}},
      {n::kPushBytesTotal, T::kCounter, "Bytes of pushes on the wire, per tensor", {l::kTensor}},
      {n::kPushDenseBytesTotal, T::kCounter,
       "Bytes the pushes would take uncompressed (4 per element), per tensor", {l::kTensor}},
      {n::kPullBytesTotal, T::kCounter, "Bytes of pull replies on the wire, per tensor",
       {l::kTensor}},
      {n::kPullDenseBytesTotal, T::kCounter,
       "Bytes the pull replies would take uncompressed, per tensor", {l::kTensor}},
      {n::kCompressionRatio, T::kGauge, "Dense bytes over wire bytes of the last push",
       {l::kTensor}},
      {n::kDensity, T::kGauge, "Fraction of the tensor's elements the last push sent",
       {l::kTensor}},
      {n::kStepsTotal, T::kCounter, "Training steps completed", {}},
      {n::kStepSeconds, T::kHistogram, "Wall time of one step (push and pull of every tensor)",
       {}},
      {n::kStepPhaseSeconds, T::kHistogram,
       "Time of a step's phases: compress, wait (for the servers), decode", {l::kPhase}},
      {n::kServerPushesTotal, T::kCounter, "Pushes received by this server, per tensor",
       {l::kTensor}},
      {n::kServerPullsTotal, T::kCounter, "Pulls answered by this server, per tensor",
       {l::kTensor}},
      {n::kServerPushBytesTotal, T::kCounter, "Push bytes received by this server, per tensor",
       {l::kTensor}},
      {n::kServerPullBytesTotal, T::kCounter, "Pull reply bytes sent by this server, per tensor",
       {l::kTensor}},
      {n::kServerPushDenseBytesTotal, T::kCounter,
       "Bytes the pushes received would take uncompressed, per tensor", {l::kTensor}},
      {n::kServerPullDenseBytesTotal, T::kCounter,
       "Bytes the pull replies sent would take uncompressed, per tensor", {l::kTensor}},
      {n::kServerPullAnswersTotal, T::kCounter,
       "Pull answers sent by this server, by the format it chose (dense, recompressed, "
       "replica, sparse)", {l::kFormat}},
      {n::kServerPullAnswerBytesTotal, T::kCounter,
       "Bytes of the pull answers sent by this server (envelope and payload), by format",
       {l::kFormat}},
      {n::kServerStepsTotal, T::kCounter,
       "Steps this server completed (sync: every live worker pushed; async: pushes applied), "
       "per tensor", {l::kTensor}},
      {n::kServerWorkSeconds, T::kHistogram,
       "Server time on one request (push: decode-add or apply; pull: encode and send), by op",
       {l::kOp}},
      {n::kServerStepWorkSeconds, T::kHistogram,
       "Server time per completed step of a slice: decode-add of every push, the optimizer "
       "and publishing the answer, per tensor", {l::kTensor}},
      {n::kServerLiveWorkers, T::kGauge, "Live workers in this server's last cluster view", {}},
      {n::kCheckpointAgeSeconds, T::kGauge,
       "Seconds since this server last wrote a checkpoint (since start when none yet)", {}},
      {n::kCheckpointsTotal, T::kCounter, "Checkpoints written", {}},
      {n::kNodes, T::kGauge, "Nodes known to the scheduler by role and state (live, dead, left)",
       {l::kNodeRole, l::kState}},
      {n::kNodesExpected, T::kGauge, "Nodes the scheduler waits for (--num_servers/--num_workers)",
       {l::kNodeRole}},
      {n::kRegistrationsTotal, T::kCounter,
       "Accepted registrations (first and re-registrations), by role", {l::kNodeRole}},
      {n::kViewsSentTotal, T::kCounter, "Cluster views sent to nodes", {}},
      {n::kClusterEpoch, T::kGauge, "Epoch of the current cluster view", {}},
      {n::kClusterFormed, T::kGauge, "1 once every expected node has registered", {}},
      {n::kLostResidueNormTotal, T::kCounter,
       "Sum of the residue L2 norms (at their last heartbeat) of workers declared dead: the "
       "error-feedback mass the job lost", {}},
      {n::kRejectedMessagesTotal, T::kCounter, "Messages refused or dropped, by reason",
       {l::kReason}},
      {n::kTransportMessagesTotal, T::kCounter, "Messages through the transport, by direction",
       {l::kDirection}},
      {n::kTransportBytesTotal, T::kCounter, "Bytes through the transport, by direction",
       {l::kDirection}},
  };
  return *catalog;
}

std::vector<double> DefaultSecondsBuckets() {
  std::vector<double> b;
  for (double s = 1e-4; s < 30; s *= 2) b.push_back(s);
  return b;
}

double Counter::Value() const { return counter_ ? counter_->Value() : 0; }
void Counter::IncrementImpl(double by) { counter_->Increment(by); }
double Gauge::Value() const { return gauge_ ? gauge_->Value() : 0; }
void Gauge::SetImpl(double value) { gauge_->Set(value); }
void Gauge::IncrementImpl(double by) { gauge_->Increment(by); }
void Histogram::ObserveImpl(double value) { histogram_->Observe(value); }

// Families are made on first use, one per name, with the process's constant labels.
struct Metrics::Families {
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges;
  std::map<std::string, prometheus::Family<prometheus::Histogram>*> histograms;
};

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const MetricsOptions& options) {
  if (options.port < 0) return Disabled();
  if (options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", options.port, " > 65535"));
  }
  if (options.role.empty()) return absl::InvalidArgumentError("metrics: empty role");
  auto m = std::unique_ptr<Metrics>(
      new Metrics(options, std::make_shared<prometheus::Registry>()));
  const std::string bind = absl::StrCat(options.host, ":", options.port);
  try {
    // civetweb throws when it cannot listen (port in use, bad address).
    m->exposer_ = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/2);
    m->exposer_->RegisterCollectable(m->registry_);
    const std::vector<int> ports = m->exposer_->GetListeningPorts();
    if (ports.empty()) return absl::UnavailableError("metrics: no listening port on " + bind);
    m->port_ = ports.front();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot serve http://", bind, "/metrics: ", e.what()));
  }
  if (!options.port_file.empty()) {
    const absl::Status s =
        WritePortFile(options.port_file, absl::StrCat("http://", options.host, ":", m->port_));
    if (!s.ok()) return s;
  }
  return m;
}

std::unique_ptr<Metrics> Metrics::Disabled() {
  return std::unique_ptr<Metrics>(new Metrics(MetricsOptions{}, nullptr));
}

Metrics::Metrics(MetricsOptions options, std::shared_ptr<prometheus::Registry> registry)
    : options_(std::move(options)),
      rank_(options_.rank),
      registry_(std::move(registry)),
      families_(std::make_unique<Families>()) {}

namespace {

// One TCP connection to host:port, closed at once (any failure ignored). An unspecified
// listening address ("0.0.0.0", "::") is knocked on through the loopback interface.
void Knock(const std::string& host, int port) {
  std::string h = host;
  if (h.empty() || h == "0.0.0.0" || h == "*") h = "127.0.0.1";
  if (h == "::" || h == "[::]") h = "::1";
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    timeval limit{0, 100 * 1000};  // connect() honours the send timeout
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
    const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}

}  // namespace

Metrics::~Metrics() {
  if (exposer_ == nullptr) return;
  // civetweb (1.15, under prometheus-cpp's Exposer) notices that it is being stopped only
  // when its poll of the listening socket returns, which an idle server's does every 2 s:
  // destroying the Exposer alone takes up to 2 s (a server's or a test's every exit). A
  // connection wakes that poll, so knock on the port until the Exposer is gone.
  std::atomic<bool> stopped{false};
  std::thread knocker([this, &stopped] {
    while (!stopped.load()) {
      Knock(options_.host, port_);
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  exposer_.reset();
  stopped.store(true);
  knocker.join();
}

absl::Status Metrics::SetRank(int rank) {
  absl::MutexLock lock(&mu_);
  if (!families_->counters.empty() || !families_->gauges.empty() ||
      !families_->histograms.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics: rank ", rank, " set after series exist with rank ", rank_));
  }
  rank_ = rank;
  return absl::OkStatus();
}

absl::Status Metrics::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

const MetricInfo* Metrics::Check(absl::string_view name, MetricType type,
                                 const MetricLabels& labels) {
  const auto& catalog = MetricCatalog();
  auto it = std::find_if(catalog.begin(), catalog.end(),
                         [&](const MetricInfo& m) { return name == m.name; });
  absl::Status error;
  if (it == catalog.end()) {
    error = absl::InvalidArgumentError(absl::StrCat("metric ", name, " is not in the catalog"));
  } else if (it->type != type) {
    error = absl::InvalidArgumentError(absl::StrCat("metric ", name, " has another type"));
  } else {
    std::vector<std::string> want(it->labels.begin(), it->labels.end());
    std::vector<std::string> got;
    for (const auto& [key, value] : labels) got.push_back(key);
    std::sort(want.begin(), want.end());
    if (want != got) {
      error = absl::InvalidArgumentError(absl::StrCat("metric ", name, " takes labels {",
                                                      absl::StrJoin(want, ","), "}, not {",
                                                      absl::StrJoin(got, ","), "}"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (!error.ok()) {
    if (status_.ok()) status_ = error;
    return nullptr;
  }
  return &*it;
}

namespace {

prometheus::Labels ConstantLabels(const MetricsOptions& o, int rank) {
  return {{"role", o.role}, {"rank", absl::StrCat(rank)}};
}

// The family of `info` in `families`, registered on first use.
template <typename Builder, typename FamilyMap>
auto& FamilyFor(Builder builder, FamilyMap& families, const MetricInfo& info,
                prometheus::Registry& registry, const MetricsOptions& options, int rank) {
  auto it = families.find(info.name);
  if (it == families.end()) {
    auto& family =
        builder.Name(info.name).Help(info.help).Labels(ConstantLabels(options, rank)).Register(
            registry);
    it = families.emplace(info.name, &family).first;
  }
  return *it->second;
}

}  // namespace

Counter Metrics::GetCounter(absl::string_view name, const MetricLabels& labels) {
  const MetricInfo* info = Check(name, MetricType::kCounter, labels);
  if (info == nullptr || !enabled()) return Counter();
  absl::MutexLock lock(&mu_);
  auto& family =
      FamilyFor(prometheus::BuildCounter(), families_->counters, *info, *registry_, options_,
                rank_);
  return Counter(&family.Add(labels));
}

Gauge Metrics::GetGauge(absl::string_view name, const MetricLabels& labels) {
  const MetricInfo* info = Check(name, MetricType::kGauge, labels);
  if (info == nullptr || !enabled()) return Gauge();
  absl::MutexLock lock(&mu_);
  auto& family =
      FamilyFor(prometheus::BuildGauge(), families_->gauges, *info, *registry_, options_,
                rank_);
  return Gauge(&family.Add(labels));
}

Histogram Metrics::GetHistogram(absl::string_view name, const MetricLabels& labels) {
  const MetricInfo* info = Check(name, MetricType::kHistogram, labels);
  if (info == nullptr || !enabled()) return Histogram();
  absl::MutexLock lock(&mu_);
  auto& family =
      FamilyFor(prometheus::BuildHistogram(), families_->histograms, *info, *registry_,
                options_, rank_);
  return Histogram(&family.Add(labels, DefaultSecondsBuckets()));
}

std::string Metrics::Scrape() const {
  if (!enabled()) return "";
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace adaps
