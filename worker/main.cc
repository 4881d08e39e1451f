// adaps-worker: a worker process. Thin: builds the config from defaults < config file <
// ADAPS_* environment < flags, creates an adaps::Worker and runs a mode:
//   --mode=synthetic  push and pull tensors of given sizes (benchmark; worker/synthetic.h)
//   --mode=train      the Fashion-MNIST trainer (worker/trainer/, wired in a later issue)
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "adaps/worker.h"
#include "common/compressor.h"
#include "common/config.h"
#include "common/logging.h"
#include "worker/synthetic.h"

ABSL_FLAG(std::string, config, "", "Config file of 'name = value' lines (also ADAPS_CONFIG)");
ABSL_FLAG(std::string, scheduler, "", "Scheduler address, e.g. tcp://127.0.0.1:5000");
ABSL_FLAG(std::string, identity, "", "Stable identity: a restarted worker gets its rank back");
ABSL_FLAG(std::string, mode, "synthetic", "synthetic or train");
ABSL_FLAG(std::string, tensors, "25M", "synthetic: total parameters (K, M, G suffixes)");
ABSL_FLAG(int, layers, 10, "synthetic: number of tensors the parameters are split into");
ABSL_FLAG(int, steps, 20, "synthetic: timed steps");
ABSL_FLAG(int, warmup, 2, "synthetic: untimed steps first");
ABSL_FLAG(std::string, compressor, "adacomp", "dense, adacomp, topk or sign");
ABSL_FLAG(int, bin_size, 500, "AdaComp bin size");
ABSL_FLAG(double, topk_fraction, 0.001, "Top-k: fraction of elements sent");
ABSL_FLAG(std::string, pull, "dense", "dense or recompressed pulls");
ABSL_FLAG(bool, compact_indices, true, "Rice-coded indices (false: plain 32-bit)");
ABSL_FLAG(int, register_timeout_ms, 60000, "How long to wait for the cluster to form");
ABSL_FLAG(int, request_timeout_ms, 30000, "Deadline of every request");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical, off");

namespace {

int Fail(const std::string& reason) {
  std::fprintf(stderr, "adaps-worker: %s\n", reason.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  adaps::InstallUsage(
      "adaps-worker: a worker of an adaps cluster (synthetic benchmark or trainer).");
  const std::vector<std::string> names = {
      "scheduler", "identity",      "mode",       "tensors",         "layers",
      "steps",     "warmup",        "compressor", "bin_size",        "topk_fraction",
      "pull",      "compact_indices", "register_timeout_ms", "request_timeout_ms", "log_level"};
  if (auto s = adaps::LoadLayeredFlags(argc, argv, names); !s.ok()) return Fail(s.ToString());
  absl::ParseCommandLine(argc, argv);

  adaps::WorkerOptions options;
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  options.identity = absl::GetFlag(FLAGS_identity);
  options.register_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_register_timeout_ms));
  options.request_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_request_timeout_ms));
  options.compact_indices = absl::GetFlag(FLAGS_compact_indices);
  options.log_level = absl::GetFlag(FLAGS_log_level);
  if (options.scheduler.empty()) return Fail("--scheduler is required");
  if (auto s = adaps::ValidateLogLevel(options.log_level); !s.ok()) return Fail(s.ToString());

  const std::string mode = absl::GetFlag(FLAGS_mode);
  adaps::SyntheticConfig synthetic;
  if (mode == "synthetic") {
    auto total = adaps::ParseCount(absl::GetFlag(FLAGS_tensors));
    if (!total.ok()) return Fail(total.status().ToString());
    auto kind = adaps::ParseCompressorKind(absl::GetFlag(FLAGS_compressor));
    if (!kind.ok()) return Fail(kind.status().ToString());
    const std::string pull = absl::GetFlag(FLAGS_pull);
    if (pull != "dense" && pull != "recompressed") {
      return Fail("--pull must be dense or recompressed");
    }
    synthetic.total_params = *total;
    synthetic.layers = absl::GetFlag(FLAGS_layers);
    synthetic.steps = absl::GetFlag(FLAGS_steps);
    synthetic.warmup = absl::GetFlag(FLAGS_warmup);
    synthetic.layer.compression = static_cast<adaps::Compression>(*kind);
    synthetic.layer.bin_size = static_cast<uint32_t>(absl::GetFlag(FLAGS_bin_size));
    synthetic.layer.topk_fraction = absl::GetFlag(FLAGS_topk_fraction);
    synthetic.layer.pull =
        pull == "dense" ? adaps::PullFormat::kDense : adaps::PullFormat::kRecompressed;
  } else if (mode == "train") {
    return Fail("--mode=train is not built into this adaps-worker yet");
  } else {
    return Fail("--mode must be synthetic or train");
  }

  adaps::MakeLogger("worker", -1, options.log_level)
      ->info("effective config: {}", adaps::DescribeFlags(names));
  auto worker = adaps::Worker::Create(options);
  if (!worker.ok()) return Fail(worker.status().ToString());
  absl::Status status = adaps::RunSynthetic(**worker, synthetic);
  absl::Status stop = (*worker)->Stop();
  if (!status.ok()) return Fail(status.ToString());
  if (!stop.ok()) return Fail(stop.ToString());
  return 0;
}
