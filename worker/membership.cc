// Worker::Impl, membership part: what the cluster means for the worker. common/cluster_client
// registers, heartbeats, re-registers with a restarted scheduler and refuses forged views and
// shutdowns; here the registration answer becomes rank and servers, later views become
// servers declared dead or moved, and a shutdown fails what is in flight.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/worker_impl.h"

namespace adaps {
namespace {

int LiveWorkersOf(const msg::ClusterView& view) {
  int live = 0;
  if (view.nodes() != nullptr) {
    for (const auto* n : *view.nodes()) live += n->role() == msg::Role::Worker && n->alive();
  }
  return live;
}

}  // namespace

Worker::Impl::Impl(const WorkerOptions& options)
    : options_(options),
      log_("worker", options.log_level),
      metrics_(Metrics::Disabled()),
      worker_metrics_(std::make_unique<WorkerMetrics>(*metrics_)) {
  TransportOptions topts;
  topts.self = Sender{msg::Role::Worker, -1};
  topts.context = options_.context;
  topts.log = &log_;
  topts.curve.server_public_key = options_.curve_server_public_key;
  topts.curve.client_public_key = options_.curve_public_key;
  topts.curve.client_secret_key = options_.curve_secret_key;
  transport_ = std::make_unique<Transport>(std::move(topts),
                                           [this](InMessage in) { Handle(std::move(in)); });
  ClusterClientOptions copts;
  copts.scheduler = options_.scheduler;
  copts.identity = options_.identity;
  copts.register_timeout = options_.register_timeout;
  copts.scheduler_grace = options_.scheduler_grace;
  copts.residue_norm = [this] { return ResidueNorm(); };
  ClusterClient::Callbacks callbacks;
  callbacks.on_view = [this](const msg::ClusterView& view) { OnView(view); };
  callbacks.on_shutdown = [this](const absl::Status& status) { OnShutdown(status); };
  cluster_ = std::make_unique<ClusterClient>(*transport_, log_, copts, std::move(callbacks));
  links_ = std::make_unique<ServerLinks>(transport_.get(), &log_);
}

Worker::Impl::~Impl() { Stop().IgnoreError(); }

absl::Status Worker::Impl::Init() {
  ADAPS_RET_CHECK(!options_.scheduler.empty(), absl::StatusCode::kInvalidArgument,
                  "no scheduler address");
  ADAPS_RET_CHECK(options_.request_timeout > absl::ZeroDuration() &&
                      options_.register_timeout > absl::ZeroDuration() &&
                      options_.scheduler_grace > absl::ZeroDuration(),
                  absl::StatusCode::kInvalidArgument, "timeouts must be positive");
  ADAPS_RETURN_IF_ERROR(ValidateLogLevel(options_.log_level));
  ADAPS_RET_CHECK(options_.compression_threads >= 0 && options_.compression_threads <= 64,
                  absl::StatusCode::kInvalidArgument, "compression_threads must be 0 to 64");
  ADAPS_RETURN_IF_ERROR(StartMetrics());
  if (options_.fusion_threshold_bytes > 0) {
    transport_->AddTimer(absl::Milliseconds(100), [this] { ExpireFusion(); });
  }
  ADAPS_RETURN_IF_ERROR(transport_->Start());
  retries_.Start();
  if (options_.compression_threads > 0) {
    pool_ = std::make_unique<JobPool>(options_.compression_threads);
    pool_->Start();
  }
  ADAPS_ASSIGN_OR_RETURN(InMessage reply, cluster_->Register());
  ADAPS_RETURN_IF_ERROR(ApplyRegistration(*reply.envelope()->body_as_ClusterView()));
  worker_metrics_->Bind(rank_);
  return absl::OkStatus();
}

// Serves /metrics from before registration on, so that probes answer while the cluster forms.
absl::Status Worker::Impl::StartMetrics() {
  if (options_.metrics_port < 0) return absl::OkStatus();
  MetricsOptions mopts;
  mopts.port = options_.metrics_port;
  mopts.host = options_.metrics_host;
  mopts.port_file = options_.metrics_port_file;
  mopts.role = "worker";
  mopts.rank = -1;  // until registered (WorkerMetrics::Bind)
  ADAPS_ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics, Metrics::Create(mopts));
  worker_metrics_ = std::make_unique<WorkerMetrics>(*metrics);
  metrics_ = std::move(metrics);
  log_.get()->info("metrics on http://{}:{}/metrics", mopts.host, metrics_->port());
  transport_->AddTimer(absl::Milliseconds(500),
                       [this] { worker_metrics_->Tick(transport_->stats()); });
  return absl::OkStatus();
}

absl::Status Worker::Impl::ApplyRegistration(const msg::ClusterView& view) {
  rank_ = view.your_rank();
  num_workers_ = view.num_workers();
  num_servers_ = view.num_servers();
  ADAPS_RETURN_IF_ERROR(links_->Connect(view, num_servers_));
  rejoined_ = view.rejoined();
  registered_at_ = absl::Now();
  live_workers_ = LiveWorkersOf(view);
  barrier_seq_ = view.next_barrier();
  if (rejoined_) {
    log_.get()->info("rejoined a running cluster at barrier {}", view.next_barrier());
  }
  log_.get()->info("registered: worker {} of {} live, {} servers", rank_, live_workers_.load(),
                   num_servers_);
  return absl::OkStatus();
}

float Worker::Impl::ResidueNorm() const {
  double sq = 0.0;
  absl::MutexLock lock(&mu_);  // (held briefly everywhere: never across an encode)
  for (const auto& [name, t] : tensors_) sq += t->residue_sq.load(std::memory_order_relaxed);
  return static_cast<float>(std::sqrt(sq));
}

absl::Status Worker::Impl::CheckRunning() {
  absl::MutexLock lock(&mu_);
  if (stopped_) return absl::FailedPreconditionError("worker stopped");
  if (shutdown_) return shutdown_status_;
  return absl::OkStatus();
}

std::string Worker::Impl::Secret() const {
  absl::MutexLock lock(&mu_);
  return secret_;
}

absl::Status Worker::Impl::Stop() {
  bool leave = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::OkStatus();
    stopped_ = true;
    leave = rank_ >= 0 && !shutdown_;
  }
  links_->Close();  // a retry waiting for a server gives up
  FailStagedFusion(absl::FailedPreconditionError("the worker stopped"));
  absl::Status status;
  // As long as any request may take: a scheduler busy with many workers leaving at once on
  // a loaded machine answered 64 of them past a fixed 2 s (issue 26), failing the job after
  // its training had finished.
  if (leave) {
    status = cluster_->Leave(options_.request_timeout);
    if (!status.ok()) {
      status = absl::Status(status.code(),
                            absl::StrCat("leaving the cluster (the scheduler finds a worker that "
                                         "did not say goodbye by its silence): ",
                                         status.message()));
    }
  }
  retries_.Close();     // a retry posted from now on fails its operation at once
  transport_->Stop();  // fails what a retry waits for
  retries_.Stop();
  if (pool_ != nullptr) pool_->Stop();  // queued Runs fail ("worker stopped"), decodes finish
  return status;
}

void Worker::Impl::Handle(InMessage in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (cluster_->Handle(in)) return;  // views and shutdowns (forged ones refused there)
  const msg::Envelope* env = in.envelope();
  if (env->request_id()) {
    transport_->Reply(in, MakeError(transport_->self(), env->request_id(),
                                    absl::InvalidArgumentError("workers take no requests")));
  }
}

// The scheduler ended the job (OK: a clean end), or was silent past the grace period.
void Worker::Impl::OnShutdown(const absl::Status& status) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const std::string why = status.ok() ? "the cluster has shut down" : std::string(status.message());
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    shutdown_status_ = status.ok() ? absl::FailedPreconditionError(why) : status;
  }
  links_->Close();
  const std::vector<int> peers = links_->Peers();
  // Nothing in flight will be answered now: fail it at once with the reason.
  const absl::StatusCode code = status.code() == absl::StatusCode::kUnavailable
                                    ? absl::StatusCode::kUnavailable
                                    : absl::StatusCode::kAborted;
  for (int peer : peers) {
    transport_->FailPeer(peer, absl::Status(code, absl::StrCat("the cluster was shut down: ", why)));
  }
}

// A newer cluster view. Fails requests to servers declared dead, and reconnects to a server
// that came back (restarted: at another address, or after being declared dead): requests
// still queued for the old incarnation fail with kUnavailable, the server's incarnation is
// bumped, and run.cc resends what was in flight and resynchronizes stale slices.
void Worker::Impl::OnView(const msg::ClusterView& view) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (view.secret() != nullptr && view.secret()->size() > 0) {
    absl::MutexLock lock(&mu_);
    secret_ = view.secret()->str();  // a restarted scheduler hands out new ones
  }
  if (view.nodes() == nullptr) return;
  live_workers_ = LiveWorkersOf(view);
  links_->ApplyView(view);
}

}  // namespace adaps
