#include "worker/app/train_mode.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/optimizer.h"
#include "common/status_macros.h"
#include "worker/kinds.h"
#include "worker/app/progress.h"
#include "worker/app/trainer/idx_reader.h"
#include "worker/app/trainer/model.h"
#include "worker/app/trainer/sharding.h"
#include "worker/app/trainer/trainer.h"

namespace adaps {
namespace {

using trainer::LayerKind;
using trainer::ParamTensor;

constexpr int kLayerKinds = 3;  // conv, fc, bias

// GradientExchange over the cluster: one PushPull per tensor, all in flight at once.
class ClusterExchange final : public trainer::GradientExchange {
 public:
  ClusterExchange(Worker* worker, int64_t decay_steps, double learning_rate, bool cosine,
                  double local_momentum)
      : worker_(worker),
        decay_steps_(decay_steps),
        lr_(learning_rate),
        cosine_(cosine),
        momentum_(static_cast<float>(local_momentum)) {}

  absl::Status Declare(std::vector<ParamTensor>& params, const TrainConfig& config) {
    for (ParamTensor& p : params) {
      const CompressorOptions o = trainer::OptionsForTensor(p, config.compression);
      TensorSpec spec;
      spec.name = p.name;
      spec.shape.assign(p.shape.begin(), p.shape.end());
      spec.bin_size = o.bin_size;
      spec.compression = ApiCompression(o.kind);
      spec.topk_fraction = o.topk_fraction;
      spec.pull = config.pull;
      ADAPS_RETURN_IF_ERROR(worker_->Declare(spec, absl::MakeSpan(p.value)));
      kinds_.push_back(o.kind);
      momentum_.AddTensor(p.size());
    }
    return absl::OkStatus();
  }

  void set_step_delay(absl::Duration delay) { delay_ = delay; }
  void set_stop_requested(std::function<bool()> f) { stop_requested_ = std::move(f); }

  absl::Status Exchange(int64_t step, std::vector<ParamTensor>& params) override {
    // Between steps: the last step's pulls are done, nothing of this one is pushed yet.
    if (stop_requested_ && stop_requested_()) {
      return absl::CancelledError(absl::StrCat("stop requested before step ", step));
    }
    if (delay_ > absl::ZeroDuration()) absl::SleepFor(delay_);
    if (worker_->rank() == 0 && cosine_ && decay_steps_ > 0) {
      // Rank 0 sets the rate before its own push of this step, so the servers apply
      // step `step` with it whatever order the pushes arrive in.
      ADAPS_RETURN_IF_ERROR(worker_->SetHyper(
          {{"learning_rate",
            ScheduledLearningRate(LrSchedule::kCosine, lr_, step, decay_steps_)}}));
    }
    std::vector<std::future<absl::Status>> pending;
    pending.reserve(params.size());
    absl::Status first = absl::OkStatus();
    for (size_t i = 0; i < params.size(); ++i) {
      ParamTensor& p = params[i];
      absl::StatusOr<absl::Span<const float>> push = momentum_.Push(i, p.grad);
      if (!push.ok()) {
        first = push.status();
        break;
      }
      pending.push_back(worker_->PushPull(p.name, *push, absl::MakeSpan(p.value)));
    }
    for (auto& f : pending) {
      absl::Status s = f.get();
      if (first.ok() && !s.ok()) first = s;
    }
    if (first.ok() && after_step_) return after_step_(step);
    return first;
  }

  // Called after every successful exchange with its step (e.g. to evaluate).
  void set_after_step(std::function<absl::Status(int64_t)> f) { after_step_ = std::move(f); }

  const std::vector<CompressorKind>& kinds() const { return kinds_; }

 private:
  Worker* worker_;
  int64_t decay_steps_;
  double lr_;
  bool cosine_;
  // --local_momentum: what each tensor pushes (its gradient, or its velocity).
  trainer::MomentumCorrection momentum_;
  absl::Duration delay_;
  std::function<bool()> stop_requested_;
  std::vector<CompressorKind> kinds_;
  std::function<absl::Status(int64_t)> after_step_;
};

struct KindTraffic {
  uint64_t wire = 0, dense = 0, pulled = 0, pulled_dense = 0;
  bool any = false;
  double rate() const { return wire ? static_cast<double>(dense) / static_cast<double>(wire) : 0.0; }
};

absl::StatusOr<std::array<KindTraffic, kLayerKinds>> TrafficByKind(
    const Worker& worker, const std::vector<ParamTensor>& params) {
  std::array<KindTraffic, kLayerKinds> out{};
  for (const ParamTensor& p : params) {
    ADAPS_ASSIGN_OR_RETURN(TrafficCounters c, worker.Traffic(p.name));
    KindTraffic& k = out[static_cast<int>(p.kind)];
    k.any = true;
    k.wire += c.push_wire_bytes;
    k.dense += c.push_dense_bytes;
    k.pulled += c.pull_wire_bytes;
    k.pulled_dense += c.pull_dense_bytes;
  }
  return out;
}

std::string Mb(uint64_t bytes) { return absl::StrFormat("%.2f MB", static_cast<double>(bytes) / 1e6); }

std::string RatesText(const std::array<KindTraffic, kLayerKinds>& t) {
  std::string s;
  for (int k = 0; k < kLayerKinds; ++k) {
    if (!t[k].any) continue;
    absl::StrAppendFormat(&s, "%s %.1fx  ", trainer::LayerKindName(static_cast<LayerKind>(k)),
                          t[k].rate());
  }
  return s;
}

}  // namespace

namespace {

// Sums of the per-kind traffic.
struct TrafficTotals {
  uint64_t wire = 0, dense = 0, pulled = 0, pulled_dense = 0;
};

TrafficTotals Totals(const std::array<KindTraffic, kLayerKinds>& traffic) {
  TrafficTotals t;
  for (const KindTraffic& k : traffic) {
    t.wire += k.wire;
    t.dense += k.dense;
    t.pulled += k.pulled;
    t.pulled_dense += k.pulled_dense;
  }
  return t;
}

double Ratio(uint64_t a, uint64_t b) {
  return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
}

// One training run of this worker: data, model, the exchange, the epochs and what rank 0
// prints (the setup, a live progress line per epoch, one line per epoch, the final line).
class TrainingRun {
 public:
  TrainingRun(Worker& worker, const TrainConfig& cfg)
      : worker_(worker), cfg_(cfg), rank_(worker.rank()), lead_(rank_ == 0) {}

  absl::Status Run() {
    ADAPS_RETURN_IF_ERROR(Prepare());
    const int live_at_start = worker_.live_workers();
    if (lead_) PrintSetup();
    ADAPS_RETURN_IF_ERROR(RunEpochs());
    ADAPS_RETURN_IF_ERROR(PrintFinal());
    // The barriers are positions in the job (the scheduler numbers them): a worker that joined
    // mid-job, or a job whose membership changed, does not end together with the others, and
    // a final barrier would hold those still training (their steps wait for the one at the
    // barrier). Such a worker leaves instead, pushing its residues (Worker::Leave).
    if (worker_.rejoined() || worker_.live_workers() != live_at_start) return worker_.Leave();
    return worker_.Barrier();
  }

 private:
  absl::Status Prepare() {
    if (cfg_.epochs < 1 || cfg_.batch < 1 || cfg_.train_limit < 0 || cfg_.test_limit < 0 ||
        cfg_.steps_limit < 0 || cfg_.log_every < 0 || cfg_.learning_rate <= 0 ||
        !(cfg_.local_momentum >= 0 && cfg_.local_momentum < 1)) {
      return absl::InvalidArgumentError(
          "--epochs and --batch must be >= 1, --lr > 0, --local_momentum in [0, 1), the limits "
          ">= 0");
    }
    ADAPS_ASSIGN_OR_RETURN(kind_, trainer::ParseModelKind(cfg_.model));
    ADAPS_ASSIGN_OR_RETURN(train_, trainer::LoadFashionMnist(cfg_.data_dir, true));
    if (lead_) {
      ADAPS_ASSIGN_OR_RETURN(test_, trainer::LoadFashionMnist(cfg_.data_dir, false));
      if (cfg_.test_limit > 0 && cfg_.test_limit < test_.count) {
        test_.count = cfg_.test_limit;
        test_.images.resize(static_cast<size_t>(test_.count) * test_.rows * test_.cols);
        test_.labels.resize(static_cast<size_t>(test_.count));
      }
    }
    ADAPS_ASSIGN_OR_RETURN(auto shards, trainer::ShardIndices(train_.count, worker_.num_workers(),
                                                              cfg_.seed, cfg_.train_limit));
    smallest_ = shards[0].size();
    for (const auto& s : shards) smallest_ = std::min(smallest_, s.size());
    steps_ = trainer::StepsPerEpoch(smallest_, cfg_.batch);
    if (steps_ < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("shards of ", smallest_, " images hold no full batch of ", cfg_.batch));
    }
    epochs_ = cfg_.epochs;
    total_steps_ = static_cast<int64_t>(steps_) * epochs_;
    if (cfg_.steps_limit > 0 && cfg_.steps_limit < total_steps_) {
      // --max_steps is exact: the last epoch stops part way, and the cosine spans the steps
      // run (not whole epochs).
      total_steps_ = cfg_.steps_limit;
      epochs_ = static_cast<int>((total_steps_ + steps_ - 1) / steps_);
      steps_ = static_cast<int>(std::min<int64_t>(steps_, total_steps_));
    }
    model_ = trainer::Model::Create(kind_, cfg_.seed);
    exchange_ = std::make_unique<ClusterExchange>(
        &worker_, total_steps_, cfg_.learning_rate, cfg_.cosine,
        cfg_.local_momentum);
    exchange_->set_step_delay(absl::Milliseconds(cfg_.step_delay_ms));
    exchange_->set_stop_requested(cfg_.stop_requested);
    if (lead_) ADAPS_RETURN_IF_ERROR(worker_.SetHyper({{"learning_rate", cfg_.learning_rate}}));
    // (The start-up barrier is behind a worker that joined a running job.)
    if (!worker_.rejoined()) ADAPS_RETURN_IF_ERROR(worker_.Barrier());
    ADAPS_RETURN_IF_ERROR(exchange_->Declare(model_->params(), cfg_));
    loop_ = std::make_unique<trainer::Trainer>(
        model_.get(), exchange_.get(), &train_,
        trainer::ShardSampler(shards[rank_], cfg_.seed, rank_), cfg_.batch);
    return absl::OkStatus();
  }

  void PrintSetup() {
    std::printf("train: %s, %zu parameters in %zu tensors, %d workers x %zu images, "
                "%d steps of %d per epoch, %d epochs, %d test images\n",
                trainer::ModelKindName(kind_), model_->num_parameters(), model_->params().size(),
                worker_.num_workers(), smallest_, steps_, cfg_.batch, epochs_, test_.count);
    if (total_steps_ < static_cast<int64_t>(steps_) * epochs_) {
      std::printf("  stopping at step %lld (--max_steps)\n", static_cast<long long>(total_steps_));
    }
    for (size_t i = 0; i < model_->params().size(); ++i) {
      const ParamTensor& p = model_->params()[i];
      const CompressorOptions o = trainer::OptionsForTensor(p, cfg_.compression);
      std::string how = CompressorKindName(o.kind);
      if (o.kind == CompressorKind::kAdaComp) absl::StrAppend(&how, " T=", o.bin_size);
      if (o.kind == CompressorKind::kTopK) absl::StrAppend(&how, " k=", o.topk_fraction);
      if (p.kind == LayerKind::kBias && o.kind == CompressorKind::kDense &&
          cfg_.compression.kind != CompressorKind::kDense) {
        how += " (small bias tensor: sent dense)";
      }
      std::printf("  %-12s %-5s %9zu  %s\n", p.name.c_str(), trainer::LayerKindName(p.kind),
                  p.size(), how.c_str());
    }
    std::fflush(stdout);
  }

  // Seconds of training so far: time spent evaluating is left out.
  double Elapsed() const { return absl::ToDoubleSeconds(absl::Now() - start_ - eval_time_); }

  // Rank 0 evaluates every --log_every steps.
  void EvaluateEveryLogEvery() {
    if (!lead_ || cfg_.log_every <= 0) return;
    exchange_->set_after_step([this](int64_t step) -> absl::Status {
      if ((step + 1) % cfg_.log_every != 0) return absl::OkStatus();
      const absl::Time t0 = absl::Now();
      ADAPS_ASSIGN_OR_RETURN(trainer::EvalResult e, trainer::Evaluate(*model_, test_));
      eval_time_ += absl::Now() - t0;
      progress_.Clear();
      std::printf("step %lld  test_acc %.4f  elapsed %.2f s\n",
                  static_cast<long long>(step + 1), e.accuracy, Elapsed());
      std::fflush(stdout);
      return absl::OkStatus();
    });
  }

  // What the progress line shows after `done` steps of the epoch.
  ProgressSample Sample(int done, double loss_sum, absl::Time epoch_start, absl::Time now) {
    ProgressSample s{done, done > 0 ? loss_sum / done : 0.0, 0.0, 0.0};
    const double seconds = absl::ToDoubleSeconds(now - epoch_start);
    if (seconds > 0) s.images_per_s = static_cast<double>(done) * cfg_.batch / seconds;
    if (auto traffic = TrafficByKind(worker_, model_->params()); traffic.ok()) {
      const TrafficTotals t = Totals(*traffic);
      if (t.wire > 0) s.compression = static_cast<double>(t.dense) / static_cast<double>(t.wire);
    }
    return s;
  }

  absl::Status RunEpochs() {
    start_ = absl::Now();
    EvaluateEveryLogEvery();
    int64_t global_step = 0;
    for (int epoch = 0; epoch < epochs_; ++epoch) {
      const absl::Time epoch_start = absl::Now();
      const int steps = StepsOfEpoch(epoch);
      if (lead_) {
        progress_.BeginEpoch(epoch, epochs_, steps, epoch_start);
        loop_->set_on_step([this, epoch_start](int done, double loss_sum) {
          const absl::Time now = absl::Now();
          if (progress_.Due(done, now)) {
            progress_.Show(Sample(done, loss_sum, epoch_start, now), now);
          }
        });
      }
      ADAPS_ASSIGN_OR_RETURN(trainer::EpochStats stats,
                             loop_->RunEpoch(epoch, steps, &global_step));
      train_seconds_ += stats.seconds;
      if (lead_) ADAPS_RETURN_IF_ERROR(ReportEpoch(epoch, stats, epoch_start));
    }
    return absl::OkStatus();
  }

  // Every epoch's steps but the last's under --max_steps.
  int StepsOfEpoch(int epoch) const {
    return static_cast<int>(
        std::min<int64_t>(steps_, total_steps_ - static_cast<int64_t>(epoch) * steps_));
  }

  absl::Status ReportEpoch(int epoch, const trainer::EpochStats& stats, absl::Time epoch_start) {
    const int steps = stats.steps;
    progress_.EndEpoch(Sample(steps, stats.mean_loss * steps, epoch_start, absl::Now()),
                       absl::Now());
    const absl::Time t0 = absl::Now();
    ADAPS_ASSIGN_OR_RETURN(eval_, trainer::Evaluate(*model_, test_));
    eval_time_ += absl::Now() - t0;
    ADAPS_ASSIGN_OR_RETURN(auto traffic, TrafficByKind(worker_, model_->params()));
    const TrafficTotals t = Totals(traffic);
    std::printf("epoch %d/%d  loss %.4f  test_acc %.4f  step %.1f ms (compute %.1f, exchange "
                "%.1f)  pushed %s  pulled %s  rate: %s elapsed %.1f s\n",
                epoch + 1, epochs_, stats.mean_loss, eval_.accuracy, 1e3 * stats.seconds / steps,
                1e3 * stats.compute_seconds / steps, 1e3 * stats.exchange_seconds / steps,
                Mb(t.wire).c_str(), Mb(t.pulled).c_str(), RatesText(traffic).c_str(), Elapsed());
    std::fflush(stdout);
    return absl::OkStatus();
  }

  absl::Status PrintFinal() {
    ADAPS_ASSIGN_OR_RETURN(auto traffic, TrafficByKind(worker_, model_->params()));
    const TrafficTotals t = Totals(traffic);
    if (lead_) {
      std::printf("final: model %s compressor %s workers %d  test_acc %.4f  pushed %s per worker "
                  "instead of %s dense (%.1fx less, %s saved)  pulled %s instead of %s (%.1fx "
                  "less)  rate: %s train time %.1f s\n",
                  trainer::ModelKindName(kind_), CompressorKindName(cfg_.compression.kind),
                  worker_.num_workers(), eval_.accuracy, Mb(t.wire).c_str(), Mb(t.dense).c_str(),
                  Ratio(t.dense, t.wire), t.dense > t.wire ? Mb(t.dense - t.wire).c_str() : "nothing",
                  Mb(t.pulled).c_str(), Mb(t.pulled_dense).c_str(), Ratio(t.pulled_dense, t.pulled),
                  RatesText(traffic).c_str(), train_seconds_);
    } else {
      std::printf("worker %d done: pushed %s instead of %s dense\n", rank_, Mb(t.wire).c_str(),
                  Mb(t.dense).c_str());
    }
    std::fflush(stdout);
    return absl::OkStatus();
  }

  Worker& worker_;
  const TrainConfig& cfg_;
  const int rank_;
  const bool lead_;
  trainer::ModelKind kind_{};
  trainer::Dataset train_, test_;
  size_t smallest_ = 0;
  int steps_ = 0, epochs_ = 0;  // per full epoch; epochs run
  int64_t total_steps_ = 0;      // steps run: epochs_ * steps_, or --max_steps
  std::unique_ptr<trainer::Model> model_;
  std::unique_ptr<ClusterExchange> exchange_;
  std::unique_ptr<trainer::Trainer> loop_;
  // Rank 0's live progress line per epoch (worker/app/progress.h).
  ProgressLine progress_{stdout, ProgressOptions{ProgressLine::IsTerminal(stdout)}};
  absl::Time start_;
  absl::Duration eval_time_;
  double train_seconds_ = 0.0;
  trainer::EvalResult eval_;
};

}  // namespace

absl::Status RunTraining(Worker& worker, const TrainConfig& cfg) {
  return TrainingRun(worker, cfg).Run();
}

}  // namespace adaps
