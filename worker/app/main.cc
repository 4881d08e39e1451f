// adaps-worker: a worker process. Thin: builds the config from defaults < config file <
// ADAPS_* environment < flags, creates an adaps::Worker and runs a mode:
//   --mode=synthetic  push and pull tensors of given sizes (benchmark; worker/app/synthetic.h)
//   --mode=train      the Fashion-MNIST trainer (worker/app/train_mode.h over worker/app/trainer/)
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "adaps/worker.h"
#include "common/compressor.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/main_flags.h"
#include "common/main_util.h"
#include "worker/app/synthetic.h"
#include "worker/app/train_mode.h"

ABSL_FLAG(std::string, scheduler, "", "Scheduler address, e.g. tcp://127.0.0.1:5000");
ABSL_FLAG(std::string, identity, "", "Stable identity: a restarted worker gets its rank back");
ABSL_FLAG(std::string, mode, "synthetic", "synthetic or train");
ABSL_FLAG(std::string, tensors, "25M", "synthetic: total parameters (K, M, G suffixes)");
ABSL_FLAG(int, layers, 10, "synthetic: number of tensors the parameters are split into");
ABSL_FLAG(int, steps, 20, "synthetic: timed steps");
ABSL_FLAG(int, warmup, 2, "synthetic: untimed steps first");
ABSL_FLAG(std::string, gradients, "stream",
          "synthetic: stream (realistic: heavy-tailed, shared by the workers, AdaComp sends "
          "about 1% at bin 500) or uniform (every element alike: 4.5-10% sent)");
ABSL_FLAG(int, backward_ms, 0,
          "synthetic: sleep this long before each layer's push (an accelerator's backward pass)");
ABSL_FLAG(std::string, compressor, "adacomp", "dense, adacomp, topk or sign");
ABSL_FLAG(int, bin_size, 500, "AdaComp bin size");
ABSL_FLAG(double, topk_fraction, 0.001, "Top-k: fraction of elements sent");
ABSL_FLAG(std::string, pull, "dense",
          "dense, recompressed or sparse pulls (sparse: servers --optimizer=mean, sum, or sgd "
          "without weight decay)");
ABSL_FLAG(bool, pull_in_place, false,
          "synthetic: each layer's parameters are its pulls' replica (TensorSpec::pull_in_place): "
          "sparse and recompressed answers change only the elements they name, no copy a step");
ABSL_FLAG(bool, compact_indices, true, "Rice-coded indices (false: plain 32-bit)");
ABSL_FLAG(int, compression_threads, 1,
          "Threads that compress pushes and decode pulls (0: on the calling and I/O threads)");
ABSL_FLAG(int, register_timeout_ms, 60000, "How long to wait for the cluster to form");
ABSL_FLAG(int, request_timeout_ms, 30000, "Deadline of every request");
ABSL_FLAG(uint64_t, fusion_threshold, 256 * 1024,
          "Tensors of fewer bytes than this travel together, one push and one pull message "
          "per step (fusion of small tensors; 0: off)");
ABSL_FLAG(std::string, model, "mlp", "train: mlp or cnn");
ABSL_FLAG(int, epochs, 3, "train: passes over the training data");
ABSL_FLAG(int, batch, 32, "train: batch size per worker and step");
ABSL_FLAG(uint64_t, seed, 1, "train: seed of the initial weights, the sharding and the order");
ABSL_FLAG(double, lr, 0.05, "train: learning rate the servers apply (rank 0 sets it)");
ABSL_FLAG(std::string, lr_schedule, "cosine", "train: constant, or cosine from --lr to 0");
ABSL_FLAG(int, train_limit, 0, "train: use a seeded subset of this many images (0: all)");
ABSL_FLAG(int, test_limit, 0, "train: evaluate on the first N test images (0: all 10,000)");
ABSL_FLAG(int, max_steps, 0, "train: stop after this many steps (0: whole epochs)");
ABSL_FLAG(int, step_delay_ms, 0,
          "train: sleep this long before each step's exchange (a straggler, to try "
          "adaps-server --backup_workers)");
ABSL_FLAG(std::string, curve_server_key, "",
          "CURVE: key file with the cluster's server public key (adaps-keygen); enables encryption");
ABSL_FLAG(std::string, curve_client_key, "",
          "CURVE: this worker's key pair file (its public key must be allowed by the cluster)");
ABSL_FLAG(int, eval_every, 0, "train: rank 0 evaluates every N steps too (0: per epoch only)");
ABSL_FLAG(int, bin_size_conv, 50, "train: AdaComp bin size of conv layers");
ABSL_FLAG(int, bin_size_fc, 500, "train: AdaComp bin size of fully-connected layers");
ABSL_FLAG(double, local_momentum, 0.0,
          "train: momentum correction (DGC): push the velocity u = m*u + grad with this m "
          "instead of the gradient; use with servers running --optimizer=sgd (0: off)");
ABSL_FLAG(bool, compress_bias, false, "train: compress biases too (default: sent dense)");
ABSL_FLAG(int, bin_size_bias, 0,
          "train: with --compress_bias, the AdaComp bin size of biases (0: --bin_size_fc)");
ABSL_FLAG(std::string, ready_file, "",
          "Write this worker's rank here (atomically) once it has joined the cluster; removed "
          "when it leaves (for health checks)");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "train: directory of the Fashion-MNIST IDX files");

namespace {

// Every range check of the flags, before anything touches the network. The data directory
// is checked here too, not after the cluster formed.
absl::Status CheckFlags(const std::string& mode) {
  if (mode != "synthetic" && mode != "train") {
    return absl::InvalidArgumentError("--mode must be synthetic or train");
  }
  const std::string pull = absl::GetFlag(FLAGS_pull);
  if (pull != "dense" && pull != "recompressed" && pull != "sparse") {
    return absl::InvalidArgumentError("--pull must be dense, recompressed or sparse");
  }
  absl::Status common = adaps::FirstError({
      adaps::CheckConnectEndpoint("scheduler", absl::GetFlag(FLAGS_scheduler)),
      adaps::CheckPositive("register_timeout_ms", absl::GetFlag(FLAGS_register_timeout_ms)),
      adaps::CheckPositive("request_timeout_ms", absl::GetFlag(FLAGS_request_timeout_ms)),
      adaps::CheckFraction("topk_fraction", absl::GetFlag(FLAGS_topk_fraction)),
      adaps::CheckPositive("bin_size", absl::GetFlag(FLAGS_bin_size)),
      adaps::CheckSharedFlags(),
  });
  if (!common.ok()) return common;
  if (mode == "synthetic") {
    return adaps::FirstError({
        adaps::CheckPositive("layers", absl::GetFlag(FLAGS_layers)),
        adaps::CheckPositive("steps", absl::GetFlag(FLAGS_steps)),
        adaps::CheckNonNegative("warmup", absl::GetFlag(FLAGS_warmup)),
    });
  }
  return adaps::FirstError({
      adaps::CheckPositive("epochs", absl::GetFlag(FLAGS_epochs)),
      adaps::CheckPositive("batch", absl::GetFlag(FLAGS_batch)),
      adaps::CheckPositive("lr", absl::GetFlag(FLAGS_lr)),
      adaps::CheckNonNegative("train_limit", absl::GetFlag(FLAGS_train_limit)),
      adaps::CheckNonNegative("test_limit", absl::GetFlag(FLAGS_test_limit)),
      adaps::CheckNonNegative("max_steps", absl::GetFlag(FLAGS_max_steps)),
      adaps::CheckNonNegative("eval_every", absl::GetFlag(FLAGS_eval_every)),
      adaps::CheckPositive("bin_size_conv", absl::GetFlag(FLAGS_bin_size_conv)),
      adaps::CheckPositive("bin_size_fc", absl::GetFlag(FLAGS_bin_size_fc)),
      adaps::CheckNonNegative("bin_size_bias", absl::GetFlag(FLAGS_bin_size_bias)),
      absl::GetFlag(FLAGS_local_momentum) >= 0 && absl::GetFlag(FLAGS_local_momentum) < 1
          ? absl::OkStatus()
          : absl::InvalidArgumentError("--local_momentum must be in [0, 1)"),
      adaps::CheckReadableDir("data_dir", absl::GetFlag(FLAGS_data_dir)),
  });
}

adaps::PullFormat Pull() {
  const std::string pull = absl::GetFlag(FLAGS_pull);
  return pull == "dense"    ? adaps::PullFormat::kDense
         : pull == "sparse" ? adaps::PullFormat::kSparse
                            : adaps::PullFormat::kRecompressed;
}

absl::StatusOr<adaps::SyntheticConfig> SyntheticFromFlags(adaps::CompressorKind kind) {
  adaps::SyntheticConfig synthetic;
  auto total = adaps::ParseCount(absl::GetFlag(FLAGS_tensors));
  if (!total.ok() || *total == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensors='", absl::GetFlag(FLAGS_tensors), "': ",
        total.ok() ? "must be > 0" : std::string(total.status().message())));
  }
  synthetic.total_params = *total;
  synthetic.layers = absl::GetFlag(FLAGS_layers);
  if (synthetic.total_params < static_cast<uint64_t>(synthetic.layers)) {
    return absl::InvalidArgumentError("--tensors must give each of --layers an element");
  }
  const std::string gradients = absl::GetFlag(FLAGS_gradients);
  if (gradients != "stream" && gradients != "uniform") {
    return absl::InvalidArgumentError(
        absl::StrCat("--gradients='", gradients, "': must be stream or uniform"));
  }
  synthetic.gradients = gradients == "stream" ? adaps::SyntheticGradients::kStream
                                              : adaps::SyntheticGradients::kUniform;
  synthetic.steps = absl::GetFlag(FLAGS_steps);
  synthetic.warmup = absl::GetFlag(FLAGS_warmup);
  if (absl::GetFlag(FLAGS_backward_ms) < 0) {
    return absl::InvalidArgumentError("--backward_ms must be >= 0");
  }
  synthetic.backward_per_layer = absl::Milliseconds(absl::GetFlag(FLAGS_backward_ms));
  synthetic.layer.compression = static_cast<adaps::Compression>(kind);
  synthetic.layer.bin_size = static_cast<uint32_t>(absl::GetFlag(FLAGS_bin_size));
  synthetic.layer.topk_fraction = absl::GetFlag(FLAGS_topk_fraction);
  synthetic.layer.pull = Pull();
  synthetic.layer.pull_in_place = absl::GetFlag(FLAGS_pull_in_place);
  return synthetic;
}

absl::StatusOr<adaps::TrainConfig> TrainFromFlags(adaps::CompressorKind kind) {
  adaps::TrainConfig train;
  train.model = absl::GetFlag(FLAGS_model);
  train.epochs = absl::GetFlag(FLAGS_epochs);
  train.batch = absl::GetFlag(FLAGS_batch);
  train.seed = absl::GetFlag(FLAGS_seed);
  train.learning_rate = absl::GetFlag(FLAGS_lr);
  const std::string schedule = absl::GetFlag(FLAGS_lr_schedule);
  if (schedule != "constant" && schedule != "cosine") {
    return absl::InvalidArgumentError("--lr_schedule must be constant or cosine");
  }
  train.cosine = schedule == "cosine";
  train.train_limit = absl::GetFlag(FLAGS_train_limit);
  train.test_limit = absl::GetFlag(FLAGS_test_limit);
  train.steps_limit = absl::GetFlag(FLAGS_max_steps);
  if (absl::GetFlag(FLAGS_step_delay_ms) < 0) {
    return absl::InvalidArgumentError("--step_delay_ms must be >= 0");
  }
  train.step_delay_ms = absl::GetFlag(FLAGS_step_delay_ms);
  train.log_every = absl::GetFlag(FLAGS_eval_every);
  train.local_momentum = absl::GetFlag(FLAGS_local_momentum);
  train.data_dir = absl::GetFlag(FLAGS_data_dir);
  train.compression.kind = kind;
  train.compression.bin_size_conv = static_cast<uint32_t>(absl::GetFlag(FLAGS_bin_size_conv));
  train.compression.bin_size_fc = static_cast<uint32_t>(absl::GetFlag(FLAGS_bin_size_fc));
  train.compression.topk_fraction = absl::GetFlag(FLAGS_topk_fraction);
  train.compression.compress_bias = absl::GetFlag(FLAGS_compress_bias);
  train.compression.bin_size_bias = static_cast<uint32_t>(absl::GetFlag(FLAGS_bin_size_bias));
  train.pull = Pull();
  return train;
}

}  // namespace

int main(int argc, char** argv) {
  adaps::MainProgram program(
      "adaps-worker", "app",
      "a worker of an adaps cluster (synthetic benchmark or trainer).");
  if (auto exit_code = program.Init(argc, argv)) return *exit_code;

  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (auto s = CheckFlags(mode); !s.ok()) return program.UsageError(s);
  adaps::WorkerOptions options;
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  options.identity = absl::GetFlag(FLAGS_identity);
  options.register_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_register_timeout_ms));
  options.request_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_request_timeout_ms));
  options.compact_indices = absl::GetFlag(FLAGS_compact_indices);
  options.fusion_threshold_bytes = absl::GetFlag(FLAGS_fusion_threshold);
  options.compression_threads = absl::GetFlag(FLAGS_compression_threads);
  options.log_level = absl::GetFlag(FLAGS_log_level);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  options.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  if (auto s = options.LoadCurveKeys(absl::GetFlag(FLAGS_curve_server_key),
                                     absl::GetFlag(FLAGS_curve_client_key));
      !s.ok()) {
    return program.UsageError(s);
  }
  if (auto s = adaps::ValidateLogLevel(options.log_level); !s.ok()) return program.UsageError(s);
  auto kind = adaps::ParseCompressorKind(absl::GetFlag(FLAGS_compressor));
  if (!kind.ok()) return program.UsageError(kind.status());
  absl::StatusOr<adaps::SyntheticConfig> synthetic;
  absl::StatusOr<adaps::TrainConfig> train;
  if (mode == "synthetic") {
    synthetic = SyntheticFromFlags(*kind);
    if (!synthetic.ok()) return program.UsageError(synthetic.status());
  } else {
    train = TrainFromFlags(*kind);
    if (!train.ok()) return program.UsageError(train.status());
  }

  adaps::MakeLogger("worker", -1, options.log_level)
      ->info("effective config: {}", program.EffectiveConfig());
  // A file left by an earlier run that crashed must not make this one look joined.
  const std::string ready_file = absl::GetFlag(FLAGS_ready_file);
  if (!ready_file.empty()) std::remove(ready_file.c_str());
  auto worker = adaps::Worker::Create(options);
  if (!worker.ok()) return program.Fail(worker.status());
  if (!ready_file.empty()) {
    auto s = adaps::WriteFileAtomically(ready_file, absl::StrCat((*worker)->rank(), "\n"));
    if (!s.ok()) {
      (void)(*worker)->Stop();
      return program.Fail(s);
    }
  }
  // SIGTERM or SIGINT (an operator scaling the job in, a launcher stopping it): finish the
  // step in flight, then leave with nothing lost (Worker::Leave pushes the residues).
  adaps::MainProgram::CatchStopSignals();
  auto stop_requested = [] { return adaps::MainProgram::StopSignal() != 0; };
  if (train.ok()) train->stop_requested = stop_requested;
  if (synthetic.ok()) synthetic->stop_requested = stop_requested;
  absl::Status status = mode == "train" ? adaps::RunTraining(**worker, *train)
                                         : adaps::RunSynthetic(**worker, *synthetic);
  if (absl::IsCancelled(status) && adaps::MainProgram::StopSignal() != 0) {
    auto logger = adaps::MakeLogger("worker", (*worker)->rank(), options.log_level);
    const int sig = adaps::MainProgram::StopSignal();
    absl::Status left = (*worker)->Leave();
    if (!ready_file.empty()) std::remove(ready_file.c_str());
    if (!left.ok()) {
      return program.Fail(absl::Status(left.code(), absl::StrCat("signal ", sig, ": ",
                                                                 status.message(),
                                                                 "; leaving failed: ",
                                                                 left.message())));
    }
    logger->info("signal {}: {}; left the job with every residue pushed", sig,
                 std::string(status.message()));
    return adaps::kExitOk;
  }
  absl::Status stop = (*worker)->Stop();
  if (!ready_file.empty()) std::remove(ready_file.c_str());
  if (!status.ok()) return program.Fail(status);
  if (!stop.ok()) {
    // The work is done and its results are with the servers: a goodbye that went
    // unanswered (a scheduler busy with 64 workers leaving, or gone) is not the job failing.
    adaps::MakeLogger("worker", (*worker)->rank(), options.log_level)
        ->warn("finished, but {}", stop.ToString());
  }
  return adaps::kExitOk;
}
