#include "worker/app/trainer/simulated_cluster.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace adaps::trainer {

KindTraffic TrafficStats::Total() const {
  KindTraffic t;
  for (const KindTraffic& c : by_kind) {
    t.messages += c.messages;
    t.elements += c.elements;
    t.sent_elements += c.sent_elements;
    t.payload_bytes += c.payload_bytes;
    t.sent_bytes += c.sent_bytes;
    t.dense_bytes += c.dense_bytes;
  }
  return t;
}

class SimulatedCluster::Endpoint final : public GradientExchange {
 public:
  Endpoint(SimulatedCluster* cluster, int worker)
      : cluster_(cluster), worker_(worker), momentum_(cluster->options_.local_momentum) {}

  absl::Status Init() {
    for (size_t i = 0; i < cluster_->server_.size(); ++i) {
      ADAPS_ASSIGN_OR_RETURN(auto c, MakeCompressor(cluster_->tensor_options_[i]));
      compressors_.push_back(std::move(c));
      residues_.emplace_back(cluster_->server_[i].size());
      momentum_.AddTensor(cluster_->server_[i].size());
    }
    counted_.resize(3);
    return absl::OkStatus();
  }

  absl::Status Exchange(int64_t step, std::vector<ParamTensor>& params) override {
    const std::vector<ParamTensor>& server = cluster_->server_;
    if (params.size() != server.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "exchange of ", params.size(), " tensors; the cluster holds ", server.size()));
    }
    for (KindTraffic& c : counted_) c = KindTraffic{};
    std::vector<std::vector<uint8_t>>& out = cluster_->pushes_[worker_];
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamTensor& p = params[i];
      if (p.name != server[i].name || p.grad.size() != server[i].size()) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " is '", p.name, "' of ",
                                                       p.grad.size(), " elements; expected '",
                                                       server[i].name, "' of ", server[i].size()));
      }
      ADAPS_ASSIGN_OR_RETURN(absl::Span<const float> push, momentum_.Push(i, p.grad));
      ADAPS_RETURN_IF_ERROR(compressors_[i]->Compress(push, residues_[i], update_));
      ADAPS_RETURN_IF_ERROR(EncodeUpdate(update_, cluster_->options_.coding, &out[i]));
      KindTraffic& c = counted_[static_cast<int>(p.kind)];
      const size_t header = cluster_->options_.message_header_bytes;
      c.messages += 1;
      c.elements += p.grad.size();
      c.sent_elements += update_.SentElements();
      c.payload_bytes += out[i].size();
      c.sent_bytes += out[i].size() + header;
      c.dense_bytes += cluster_->dense_message_bytes_[i];
    }
    return cluster_->Arrive(worker_, step, counted_, params);
  }

 private:
  SimulatedCluster* cluster_;
  int worker_;
  std::vector<std::unique_ptr<Compressor>> compressors_;
  std::vector<SliceState> residues_;
  MomentumCorrection momentum_;
  CompressedUpdate update_;
  std::vector<KindTraffic> counted_;
};

absl::StatusOr<std::unique_ptr<SimulatedCluster>> SimulatedCluster::Create(
    const SimulationOptions& options, const std::vector<ParamTensor>& initial) {
  if (options.workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("workers must be >= 1, got ", options.workers));
  }
  if (!(options.learning_rate > 0.0f) || options.momentum < 0.0f || options.momentum >= 1.0f ||
      options.local_momentum < 0.0f || options.local_momentum >= 1.0f) {
    return absl::InvalidArgumentError(
        "learning rate must be > 0, momentum and local momentum in [0, 1)");
  }
  if (initial.empty()) return absl::InvalidArgumentError("no parameters");
  std::unique_ptr<SimulatedCluster> c(new SimulatedCluster(options));
  c->server_ = initial;
  for (ParamTensor& p : c->server_) {
    p.grad.assign(p.size(), 0.0f);
    c->optimizer_state_.emplace_back();
    CompressorOptions o = OptionsForTensor(p, options.compression);
    ADAPS_RETURN_IF_ERROR(ValidateOptions(o));
    c->tensor_options_.push_back(o);
    CompressedUpdate dense;
    dense.kind = CompressorKind::kDense;
    dense.length = static_cast<uint32_t>(p.size());
    dense.values.assign(p.size(), 0.0f);
    std::vector<uint8_t> bytes;
    ADAPS_RETURN_IF_ERROR(EncodeUpdate(dense, options.coding, &bytes));
    c->dense_message_bytes_.push_back(bytes.size() + options.message_header_bytes);
  }
  c->pushes_.assign(options.workers, std::vector<std::vector<uint8_t>>(initial.size()));
  for (int w = 0; w < options.workers; ++w) {
    auto e = std::make_unique<Endpoint>(c.get(), w);
    ADAPS_RETURN_IF_ERROR(e->Init());
    c->endpoints_.push_back(std::move(e));
  }
  return c;
}

SimulatedCluster::SimulatedCluster(const SimulationOptions& options) : options_(options) {}
SimulatedCluster::~SimulatedCluster() = default;

GradientExchange* SimulatedCluster::endpoint(int w) {
  if (w < 0 || w >= options_.workers) return nullptr;
  return endpoints_[w].get();
}

TrafficStats SimulatedCluster::traffic() const {
  std::lock_guard<std::mutex> lock(mu_);
  return traffic_;
}

absl::Status SimulatedCluster::AggregateLocked() {
  const float inv = 1.0f / static_cast<float>(options_.workers);
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerKind::kMomentum;
  optimizer.momentum = options_.momentum;
  optimizer.weight_decay = 0.0f;
  optimizer.learning_rate = static_cast<float>(ScheduledLearningRate(
      LrSchedule::kCosine, options_.learning_rate, step_, options_.decay_steps));
  for (size_t i = 0; i < server_.size(); ++i) {
    ParamTensor& p = server_[i];
    std::fill(p.grad.begin(), p.grad.end(), 0.0f);
    for (int w = 0; w < options_.workers; ++w) {
      ADAPS_RETURN_IF_ERROR(DecodeAdd(pushes_[w][i], inv, absl::MakeSpan(p.grad)));
    }
    ApplyOptimizer(optimizer, p.grad, absl::MakeSpan(p.value), optimizer_state_[i]);
  }
  return absl::OkStatus();
}

absl::Status SimulatedCluster::Arrive(int w, int64_t step,
                                      const std::vector<KindTraffic>& counted,
                                      std::vector<ParamTensor>& params) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failure_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cluster failed earlier: ", failure_.message()));
    }
    if (step != step_) {
      failure_ = absl::FailedPreconditionError(absl::StrCat(
          "worker ", w, " pushed step ", step, " while the server is at step ", step_));
      cv_.notify_all();
      return failure_;
    }
    for (int k = 0; k < 3; ++k) {
      KindTraffic& t = traffic_.by_kind[k];
      t.messages += counted[k].messages;
      t.elements += counted[k].elements;
      t.sent_elements += counted[k].sent_elements;
      t.payload_bytes += counted[k].payload_bytes;
      t.sent_bytes += counted[k].sent_bytes;
      t.dense_bytes += counted[k].dense_bytes;
    }
    for (size_t d : dense_message_bytes_) traffic_.pulled_bytes += d;
    if (++arrived_ == options_.workers) {
      absl::Status s = AggregateLocked();
      if (!s.ok()) {
        failure_ = s;
        cv_.notify_all();
        return s;
      }
      arrived_ = 0;
      ++step_;
      ++generation_;
      cv_.notify_all();
    } else {
      const uint64_t gen = generation_;
      const bool released = cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.barrier_timeout),
                                         [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                           return generation_ != gen || !failure_.ok();
                                         });
      if (!released) {
        failure_ = absl::DeadlineExceededError(
            absl::StrCat("worker ", w, " waited ", absl::FormatDuration(options_.barrier_timeout),
                         " for the other workers at step ", step));
        cv_.notify_all();
        return failure_;
      }
      if (generation_ == gen) return failure_;
    }
  }
  // The server values change only when every worker has arrived again, which this one
  // has not: reading them unlocked is safe.
  for (size_t i = 0; i < params.size(); ++i) params[i].value = server_[i].value;
  return absl::OkStatus();
}

}  // namespace adaps::trainer
