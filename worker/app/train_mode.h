// adaps-worker --mode=train: the built-in Fashion-MNIST trainer (worker/app/trainer/) running
// over the real cluster through the worker library. Every worker trains on its own disjoint
// share of the training images; the servers average the pushed (compressed) gradients and
// apply the optimizer; rank 0 sets the learning rate schedule and reports test accuracy.
#ifndef ADAPS_WORKER_APP_TRAIN_MODE_H_
#define ADAPS_WORKER_APP_TRAIN_MODE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "adaps/worker.h"
#include "worker/app/trainer/exchange.h"

namespace adaps {

struct TrainConfig {
  std::string model = "mlp";  // mlp or cnn
  int epochs = 3;
  int batch = 32;
  uint64_t seed = 1;
  double learning_rate = 0.05;
  bool cosine = true;      // learning rate from learning_rate down to 0 over the run
  int train_limit = 0;     // 0: all 60,000 training images
  int test_limit = 0;      // 0: all 10,000 test images
  int steps_limit = 0;     // 0: whole epochs; else stop after this many steps in all
  int log_every = 0;       // rank 0 also evaluates and prints every N steps (0: per epoch)
  int step_delay_ms = 0;   // sleep this long before each step's exchange (a straggler, for
                           // --backup_workers experiments)
  // > 0: momentum correction (DGC): each worker pushes its velocity u = m u + grad instead
  // of the gradient; the servers should then run plain SGD. 0: push the gradient.
  double local_momentum = 0.0;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  trainer::CompressionConfig compression;
  PullFormat pull = PullFormat::kDense;
  // Asked before each step's exchange (null: never): true ends the run there, between
  // steps with nothing in flight, with kCancelled (adaps-worker then leaves: Worker::Leave).
  std::function<bool()> stop_requested;
};

// Runs the whole training on `worker`; prints progress on stdout (rank 0: every line,
// other ranks: the final line). kInvalidArgument for a bad config, kNotFound/kDataLoss for
// missing or malformed data files, and the worker's errors as they come.
absl::Status RunTraining(Worker& worker, const TrainConfig& config);

}  // namespace adaps

#endif  // ADAPS_WORKER_APP_TRAIN_MODE_H_
