#include "worker/train_mode.h"

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
#include "worker/progress.h"
#include "worker/trainer/idx_reader.h"
#include "worker/trainer/model.h"
#include "worker/trainer/sharding.h"
#include "worker/trainer/trainer.h"

namespace adaps {
namespace {

using trainer::LayerKind;
using trainer::ParamTensor;

constexpr int kLayerKinds = 3;  // conv, fc, bias

// GradientExchange over the cluster: one PushPull per tensor, all in flight at once.
class ClusterExchange final : public trainer::GradientExchange {
 public:
  ClusterExchange(Worker* worker, int64_t decay_steps, double learning_rate, bool cosine)
      : worker_(worker), decay_steps_(decay_steps), lr_(learning_rate), cosine_(cosine) {}

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
    }
    return absl::OkStatus();
  }

  absl::Status Exchange(int64_t step, std::vector<ParamTensor>& params) override {
    if (worker_->rank() == 0 && cosine_ && decay_steps_ > 0) {
      // Rank 0 sets the rate before its own push of this step, so the servers apply
      // step `step` with it whatever order the pushes arrive in.
      ADAPS_RETURN_IF_ERROR(worker_->SetHyper(
          {{"learning_rate",
            ScheduledLearningRate(LrSchedule::kCosine, lr_, step, decay_steps_)}}));
    }
    std::vector<std::future<absl::Status>> pending;
    pending.reserve(params.size());
    for (ParamTensor& p : params) {
      pending.push_back(worker_->PushPull(p.name, p.grad, absl::MakeSpan(p.value)));
    }
    absl::Status first = absl::OkStatus();
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

absl::Status RunTraining(Worker& worker, const TrainConfig& cfg) {
  if (cfg.epochs < 1 || cfg.batch < 1 || cfg.train_limit < 0 || cfg.test_limit < 0 ||
      cfg.steps_limit < 0 || cfg.log_every < 0 || cfg.learning_rate <= 0) {
    return absl::InvalidArgumentError(
        "--epochs and --batch must be >= 1, --lr > 0, the limits >= 0");
  }
  ADAPS_ASSIGN_OR_RETURN(trainer::ModelKind kind, trainer::ParseModelKind(cfg.model));
  const int rank = worker.rank(), workers = worker.num_workers();
  const bool lead = rank == 0;

  ADAPS_ASSIGN_OR_RETURN(trainer::Dataset train, trainer::LoadFashionMnist(cfg.data_dir, true));
  trainer::Dataset test;
  if (lead) {
    ADAPS_ASSIGN_OR_RETURN(test, trainer::LoadFashionMnist(cfg.data_dir, false));
    if (cfg.test_limit > 0 && cfg.test_limit < test.count) {
      test.count = cfg.test_limit;
      test.images.resize(static_cast<size_t>(test.count) * test.rows * test.cols);
      test.labels.resize(static_cast<size_t>(test.count));
    }
  }
  ADAPS_ASSIGN_OR_RETURN(auto shards,
                         trainer::ShardIndices(train.count, workers, cfg.seed, cfg.train_limit));
  size_t smallest = shards[0].size();
  for (const auto& s : shards) smallest = std::min(smallest, s.size());
  int steps = trainer::StepsPerEpoch(smallest, cfg.batch);
  if (steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("shards of ", smallest, " images hold no full batch of ", cfg.batch));
  }
  int epochs = cfg.epochs;
  if (cfg.steps_limit > 0) {
    epochs = std::min(epochs, (cfg.steps_limit + steps - 1) / steps);
    steps = std::min(steps, cfg.steps_limit);
  }

  std::unique_ptr<trainer::Model> model = trainer::Model::Create(kind, cfg.seed);
  ClusterExchange exchange(&worker, static_cast<int64_t>(steps) * epochs, cfg.learning_rate,
                           cfg.cosine);
  if (lead) ADAPS_RETURN_IF_ERROR(worker.SetHyper({{"learning_rate", cfg.learning_rate}}));
  ADAPS_RETURN_IF_ERROR(worker.Barrier());
  ADAPS_RETURN_IF_ERROR(exchange.Declare(model->params(), cfg));
  trainer::Trainer loop(model.get(), &exchange, &train,
                        trainer::ShardSampler(shards[rank], cfg.seed, rank), cfg.batch);

  if (lead) {
    std::printf("train: %s, %zu parameters in %zu tensors, %d workers x %zu images, "
                "%d steps of %d per epoch, %d epochs, %d test images\n",
                trainer::ModelKindName(kind), model->num_parameters(), model->params().size(),
                workers, smallest, steps, cfg.batch, epochs, test.count);
    for (size_t i = 0; i < model->params().size(); ++i) {
      const ParamTensor& p = model->params()[i];
      const CompressorOptions o = trainer::OptionsForTensor(p, cfg.compression);
      std::string how = CompressorKindName(o.kind);
      if (o.kind == CompressorKind::kAdaComp) absl::StrAppend(&how, " T=", o.bin_size);
      if (o.kind == CompressorKind::kTopK) absl::StrAppend(&how, " k=", o.topk_fraction);
      if (p.kind == LayerKind::kBias && o.kind == CompressorKind::kDense &&
          cfg.compression.kind != CompressorKind::kDense) {
        how += " (small bias tensor: sent dense)";
      }
      std::printf("  %-12s %-5s %9zu  %s\n", p.name.c_str(), trainer::LayerKindName(p.kind),
                  p.size(), how.c_str());
    }
    std::fflush(stdout);
  }

  // Rank 0's live progress line per epoch (worker/progress.h).
  ProgressLine progress(stdout, ProgressOptions{ProgressLine::IsTerminal(stdout)});
  int64_t global_step = 0;
  double train_seconds = 0.0;
  const absl::Time start = absl::Now();
  // Time spent evaluating is left out of the elapsed training time.
  absl::Duration eval_time;
  auto elapsed = [&] { return absl::ToDoubleSeconds(absl::Now() - start - eval_time); };
  if (lead && cfg.log_every > 0) {
    exchange.set_after_step([&](int64_t step) -> absl::Status {
      if ((step + 1) % cfg.log_every != 0) return absl::OkStatus();
      const absl::Time t0 = absl::Now();
      ADAPS_ASSIGN_OR_RETURN(trainer::EvalResult e, trainer::Evaluate(*model, test));
      eval_time += absl::Now() - t0;
      progress.Clear();
      std::printf("step %lld  test_acc %.4f  elapsed %.2f s\n",
                  static_cast<long long>(step + 1), e.accuracy, elapsed());
      std::fflush(stdout);
      return absl::OkStatus();
    });
  }
  trainer::EvalResult eval;
  // Dense over wire bytes pushed so far (0 when unknown): only when a line is shown.
  auto sample = [&](int done, double loss_sum, absl::Time epoch_start, absl::Time now) {
    ProgressSample s{done, done > 0 ? loss_sum / done : 0.0, 0.0, 0.0};
    const double seconds = absl::ToDoubleSeconds(now - epoch_start);
    if (seconds > 0) s.images_per_s = static_cast<double>(done) * cfg.batch / seconds;
    if (auto traffic = TrafficByKind(worker, model->params()); traffic.ok()) {
      uint64_t wire = 0, dense = 0;
      for (const KindTraffic& k : *traffic) wire += k.wire, dense += k.dense;
      if (wire > 0) s.compression = static_cast<double>(dense) / static_cast<double>(wire);
    }
    return s;
  };
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const absl::Time epoch_start = absl::Now();
    if (lead) {
      progress.BeginEpoch(epoch, epochs, steps, epoch_start);
      loop.set_on_step([&](int done, double loss_sum) {
        const absl::Time now = absl::Now();
        if (progress.Due(done, now)) progress.Show(sample(done, loss_sum, epoch_start, now), now);
      });
    }
    ADAPS_ASSIGN_OR_RETURN(trainer::EpochStats stats, loop.RunEpoch(epoch, steps, &global_step));
    train_seconds += stats.seconds;
    if (!lead) continue;
    progress.EndEpoch(sample(steps, stats.mean_loss * steps, epoch_start, absl::Now()),
                      absl::Now());
    const absl::Time t0 = absl::Now();
    ADAPS_ASSIGN_OR_RETURN(eval, trainer::Evaluate(*model, test));
    eval_time += absl::Now() - t0;
    ADAPS_ASSIGN_OR_RETURN(auto traffic, TrafficByKind(worker, model->params()));
    uint64_t wire = 0, dense = 0, pulled = 0;
    for (const KindTraffic& k : traffic) {
      wire += k.wire;
      dense += k.dense;
      pulled += k.pulled;
    }
    std::printf("epoch %d/%d  loss %.4f  test_acc %.4f  step %.1f ms (compute %.1f, exchange "
                "%.1f)  pushed %s  pulled %s  rate: %s elapsed %.1f s\n",
                epoch + 1, epochs, stats.mean_loss, eval.accuracy, 1e3 * stats.seconds / steps,
                1e3 * stats.compute_seconds / steps, 1e3 * stats.exchange_seconds / steps,
                Mb(wire).c_str(), Mb(pulled).c_str(), RatesText(traffic).c_str(), elapsed());
    std::fflush(stdout);
  }
  ADAPS_ASSIGN_OR_RETURN(auto traffic, TrafficByKind(worker, model->params()));
  uint64_t wire = 0, dense = 0, pulled = 0, pulled_dense = 0;
  for (const KindTraffic& k : traffic) {
    wire += k.wire;
    dense += k.dense;
    pulled += k.pulled;
    pulled_dense += k.pulled_dense;
  }
  auto ratio = [](uint64_t a, uint64_t b) {
    return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
  };
  if (lead) {
    std::printf("final: model %s compressor %s workers %d  test_acc %.4f  pushed %s per worker "
                "instead of %s dense (%.1fx less, %s saved)  pulled %s instead of %s (%.1fx "
                "less)  rate: %s train time %.1f s\n",
                trainer::ModelKindName(kind), CompressorKindName(cfg.compression.kind), workers,
                eval.accuracy, Mb(wire).c_str(), Mb(dense).c_str(), ratio(dense, wire),
                dense > wire ? Mb(dense - wire).c_str() : "nothing", Mb(pulled).c_str(), Mb(pulled_dense).c_str(),
                ratio(pulled_dense, pulled), RatesText(traffic).c_str(), train_seconds);
  } else {
    std::printf("worker %d done: pushed %s instead of %s dense\n", rank, Mb(wire).c_str(),
                Mb(dense).c_str());
  }
  std::fflush(stdout);
  return worker.Barrier();
}

}  // namespace adaps
