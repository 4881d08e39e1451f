// The training loop of one data-parallel worker: per step, take the next batch of its
// shard, compute the gradients, and hand them to a GradientExchange that returns the new
// parameters. The same loop runs in the in-process simulation (one Trainer per simulated
// worker, each on its own thread) and in the cluster worker.
//
// Ownership: the trainer borrows the model, the exchange and the data set, which must
// outlive it. Thread-safety: thread-compatible; one thread drives one trainer.
#ifndef ADAPS_WORKER_APP_TRAINER_TRAINER_H_
#define ADAPS_WORKER_APP_TRAINER_TRAINER_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "worker/app/trainer/exchange.h"
#include "worker/app/trainer/idx_reader.h"
#include "worker/app/trainer/model.h"
#include "worker/app/trainer/sharding.h"

namespace adaps::trainer {

struct EpochStats {
  int steps = 0;
  double mean_loss = 0.0;         // mean training loss over this worker's batches
  double seconds = 0.0;           // wall time of the epoch
  double compute_seconds = 0.0;   // forward and backward passes
  double exchange_seconds = 0.0;  // compress, push, wait, pull
};

// Steps per epoch when the smallest share has `smallest_shard` images: every worker must
// run the same number of steps for a synchronous exchange.
int StepsPerEpoch(size_t smallest_shard, int batch_size);

class Trainer {
 public:
  Trainer(Model* model, GradientExchange* exchange, const Dataset* train, ShardSampler sampler,
          int batch_size)
      : model_(model),
        exchange_(exchange),
        train_(train),
        sampler_(std::move(sampler)),
        batch_size_(batch_size) {}

  // Runs `steps` steps of epoch `epoch` (batches in that epoch's order of the shard),
  // numbering them from `*global_step`, which it advances. kInvalidArgument when the shard
  // is too small for `steps` batches; exchange errors are returned as they come.
  absl::StatusOr<EpochStats> RunEpoch(int epoch, int steps, int64_t* global_step);

  // Called after every step of RunEpoch with the steps done in the epoch and the sum of
  // their losses (e.g. for a progress line). Same thread as RunEpoch.
  void set_on_step(std::function<void(int done, double loss_sum)> f) { on_step_ = std::move(f); }

 private:
  Model* model_;
  GradientExchange* exchange_;
  const Dataset* train_;
  ShardSampler sampler_;
  int batch_size_;
  Matrix batch_;
  std::vector<uint8_t> labels_;
  std::function<void(int, double)> on_step_;
};

}  // namespace adaps::trainer

#endif  // ADAPS_WORKER_APP_TRAINER_TRAINER_H_
