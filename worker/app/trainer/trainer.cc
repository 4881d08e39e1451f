#include "worker/app/trainer/trainer.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/status_macros.h"

namespace adaps::trainer {

int StepsPerEpoch(size_t smallest_shard, int batch_size) {
  if (batch_size <= 0) return 0;
  return static_cast<int>(smallest_shard / static_cast<size_t>(batch_size));
}

absl::StatusOr<EpochStats> Trainer::RunEpoch(int epoch, int steps, int64_t* global_step) {
  if (batch_size_ <= 0 || static_cast<size_t>(steps) * batch_size_ > sampler_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(steps, " batches of ", batch_size_,
                                                   " do not fit a shard of ", sampler_.size()));
  }
  const std::vector<uint32_t> order = sampler_.EpochOrder(epoch);
  EpochStats stats;
  const absl::Time start = absl::Now();
  double loss_sum = 0.0;
  for (int s = 0; s < steps; ++s) {
    const absl::Time t0 = absl::Now();
    GatherBatch(
        *train_,
        absl::MakeConstSpan(order).subspan(static_cast<size_t>(s) * batch_size_, batch_size_),
        &batch_, &labels_);
    ADAPS_ASSIGN_OR_RETURN(float loss, model_->ComputeGradients(batch_, labels_));
    loss_sum += loss;
    const absl::Time t1 = absl::Now();
    ADAPS_RETURN_IF_ERROR(exchange_->Exchange(*global_step, model_->params()));
    ++*global_step;
    stats.compute_seconds += absl::ToDoubleSeconds(t1 - t0);
    stats.exchange_seconds += absl::ToDoubleSeconds(absl::Now() - t1);
    if (on_step_) on_step_(s + 1, loss_sum);
  }
  stats.steps = steps;
  stats.mean_loss = steps > 0 ? loss_sum / steps : 0.0;
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

}  // namespace adaps::trainer
