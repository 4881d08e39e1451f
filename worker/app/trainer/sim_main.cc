// adaps-train-sim: trains a model on Fashion-MNIST with W simulated data-parallel workers
// in one process (SimulatedCluster), pushing compressed gradients through the real codec
// and counting the bytes; for accuracy studies of the compressors. Configuration comes
// from defaults and flags only.
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/app/trainer/idx_reader.h"
#include "worker/app/trainer/model.h"
#include "worker/app/trainer/sharding.h"
#include "worker/app/trainer/simulated_cluster.h"
#include "worker/app/trainer/trainer.h"

ABSL_FLAG(std::string, model, "mlp", "mlp or cnn");
ABSL_FLAG(std::string, compressor, "adacomp", "dense, adacomp, topk or sign");
ABSL_FLAG(int, workers, 4, "number of simulated data-parallel workers");
ABSL_FLAG(int, epochs, 3, "passes over the training data");
ABSL_FLAG(uint64_t, seed, 1, "seed of the initial weights, the sharding and the batch order");
ABSL_FLAG(double, lr, 0.05, "server learning rate (SGD with momentum)");
ABSL_FLAG(std::string, lr_schedule, "cosine",
          "constant, or cosine: from --lr down to 0 over the whole run");
ABSL_FLAG(double, momentum, 0.9, "server momentum");
ABSL_FLAG(double, local_momentum, 0.0,
          "the workers' momentum correction (as adaps-worker --local_momentum; use with "
          "--momentum=0, the main command's recipe)");
ABSL_FLAG(int, batch, 32, "batch size per worker and step");
ABSL_FLAG(uint32_t, bin_size_conv, 50, "AdaComp bin size for conv layers");
ABSL_FLAG(uint32_t, bin_size_fc, 500, "AdaComp bin size for fully-connected layers");
ABSL_FLAG(double, topk_fraction, 0.001, "Top-k: fraction of each tensor sent per step");
ABSL_FLAG(bool, compress_bias, false, "compress biases too (default: biases go dense)");
ABSL_FLAG(int, train_limit, 0, "train on a seeded subset of this many images (0: all 60000)");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "directory with the Fashion-MNIST IDX files (plain or .gz)");
ABSL_FLAG(std::string, csv, "", "append one row per epoch to this CSV file");

namespace adaps::trainer {
namespace {

struct Config {
  ModelKind model;
  SimulationOptions sim;
  int epochs;
  uint64_t seed;
  int batch;
  int train_limit;
  std::string data_dir;
  std::string csv;
  bool cosine;
};

absl::StatusOr<Config> LoadConfig() {
  Config c;
  ADAPS_ASSIGN_OR_RETURN(c.model, ParseModelKind(absl::GetFlag(FLAGS_model)));
  ADAPS_ASSIGN_OR_RETURN(c.sim.compression.kind,
                         ParseCompressorKind(absl::GetFlag(FLAGS_compressor)));
  c.sim.workers = absl::GetFlag(FLAGS_workers);
  c.sim.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_lr));
  c.sim.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  c.sim.local_momentum = static_cast<float>(absl::GetFlag(FLAGS_local_momentum));
  c.sim.compression.bin_size_conv = absl::GetFlag(FLAGS_bin_size_conv);
  c.sim.compression.bin_size_fc = absl::GetFlag(FLAGS_bin_size_fc);
  c.sim.compression.topk_fraction = absl::GetFlag(FLAGS_topk_fraction);
  c.sim.compression.compress_bias = absl::GetFlag(FLAGS_compress_bias);
  c.epochs = absl::GetFlag(FLAGS_epochs);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.batch = absl::GetFlag(FLAGS_batch);
  c.train_limit = absl::GetFlag(FLAGS_train_limit);
  c.data_dir = absl::GetFlag(FLAGS_data_dir);
  c.csv = absl::GetFlag(FLAGS_csv);
  const std::string schedule = absl::GetFlag(FLAGS_lr_schedule);
  if (schedule != "constant" && schedule != "cosine") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --lr_schedule '", schedule, "' (constant or cosine)"));
  }
  c.cosine = schedule == "cosine";
  if (c.sim.workers < 1 || c.epochs < 1 || c.batch < 1 || c.train_limit < 0) {
    return absl::InvalidArgumentError(
        "--workers, --epochs and --batch must be >= 1, "
        "--train_limit >= 0");
  }
  return c;
}

std::string Megabytes(uint64_t bytes) { return absl::StrFormat("%.2f MB", bytes / 1e6); }

std::string RateText(const KindTraffic& c, bool dense) {
  if (c.messages == 0) return "-";
  return absl::StrFormat("%.1fx%s", c.rate(), dense ? " (dense)" : "");
}

void LogConfig(const Config& cfg) {
  const CompressionConfig& comp = cfg.sim.compression;
  spdlog::info(
      "[adaps-train-sim] model={} compressor={} workers={} epochs={} seed={} lr={} momentum={} "
      "local_momentum={} "
      "lr_schedule={} batch={} bin_size_conv={} bin_size_fc={} topk_fraction={} compress_bias={} "
      "train_limit={} data_dir={} csv={} header_bytes_per_push={}",
      ModelKindName(cfg.model), CompressorKindName(comp.kind), cfg.sim.workers, cfg.epochs,
      cfg.seed, cfg.sim.learning_rate, cfg.sim.momentum, cfg.sim.local_momentum, cfg.cosine ? "cosine" : "constant",
      cfg.batch, comp.bin_size_conv, comp.bin_size_fc, comp.topk_fraction, comp.compress_bias,
      cfg.train_limit, cfg.data_dir, cfg.csv.empty() ? "-" : cfg.csv, cfg.sim.message_header_bytes);
}

// The model's tensors and how each is compressed.
void PrintTensors(const Config& cfg, const Model& model, const SimulatedCluster& cluster,
                  size_t total, int steps, int test_count) {
  std::printf(
      "%s: %zu parameters in %zu tensors; %zu training images over %d workers "
      "(%d steps of %d per worker per epoch), %d test images\n",
      ModelKindName(cfg.model), model.num_parameters(), model.params().size(), total,
      cfg.sim.workers, steps, cfg.batch, test_count);
  for (size_t i = 0; i < model.params().size(); ++i) {
    const ParamTensor& p = model.params()[i];
    const CompressorOptions& o = cluster.tensor_options()[i];
    std::string how = CompressorKindName(o.kind);
    if (o.kind == CompressorKind::kAdaComp) absl::StrAppend(&how, " T=", o.bin_size);
    if (o.kind == CompressorKind::kTopK) absl::StrAppend(&how, " k=", o.topk_fraction);
    if (p.kind == LayerKind::kBias && o.kind == CompressorKind::kDense &&
        cfg.sim.compression.kind != CompressorKind::kDense) {
      how += " (bias: sent dense)";
    }
    std::printf("  %-14s %-5s %8zu  %s\n", p.name.c_str(), LayerKindName(p.kind), p.size(),
                how.c_str());
  }
}

absl::StatusOr<std::FILE*> OpenCsv(const std::string& path) {
  if (path.empty()) return nullptr;
  std::FILE* csv = std::fopen(path.c_str(), "a");
  if (csv == nullptr) return absl::UnavailableError(absl::StrCat("cannot open ", path));
  std::fseek(csv, 0, SEEK_END);
  if (std::ftell(csv) == 0) {
    std::fprintf(csv,
                 "model,compressor,workers,seed,epoch,train_loss,test_loss,test_acc,step_ms,"
                 "pushed_bytes,dense_bytes,pulled_bytes,rate_conv,rate_fc,rate_bias,rate_total,"
                 "payload_rate_conv,payload_rate_fc,density_conv,density_fc,seconds\n");
  }
  return csv;
}

// One epoch's results, as printed and written to the CSV.
struct EpochReport {
  int epoch = 0;
  double loss = 0.0;
  double step_ms = 0.0;
  EvalResult eval;
  TrafficStats traffic;
  double elapsed_s = 0.0;
};

void PrintEpoch(const Config& cfg, const EpochReport& r, std::FILE* csv) {
  const CompressionConfig& comp = cfg.sim.compression;
  const bool bias_dense = !comp.compress_bias || comp.kind == CompressorKind::kDense;
  const TrafficStats& t = r.traffic;
  const KindTraffic& conv = t.by_kind[static_cast<int>(LayerKind::kConv)];
  const KindTraffic& fc = t.by_kind[static_cast<int>(LayerKind::kFullyConnected)];
  const KindTraffic& bias = t.by_kind[static_cast<int>(LayerKind::kBias)];
  const KindTraffic all = t.Total();
  std::printf(
      "epoch %d/%d  loss %.4f  test_acc %.4f  step %.1f ms  pushed %s (dense %s)  "
      "pulled %s  rate: conv %s  fc %s  bias %s  total %.1fx\n",
      r.epoch + 1, cfg.epochs, r.loss, r.eval.accuracy, r.step_ms,
      Megabytes(all.sent_bytes).c_str(), Megabytes(all.dense_bytes).c_str(),
      Megabytes(t.pulled_bytes).c_str(), RateText(conv, false).c_str(),
      RateText(fc, false).c_str(), RateText(bias, bias_dense).c_str(), all.rate());
  std::fflush(stdout);
  if (csv == nullptr) return;
  auto payload_rate = [](const KindTraffic& c) {
    return c.payload_bytes ? static_cast<double>(c.elements) * 4.0 / c.payload_bytes : 0.0;
  };
  auto density = [](const KindTraffic& c) {
    return c.elements ? static_cast<double>(c.sent_elements) / c.elements : 0.0;
  };
  std::fprintf(csv,
               "%s,%s,%d,%llu,%d,%.6f,%.6f,%.6f,%.3f,%llu,%llu,%llu,%.3f,%.3f,%.3f,%.3f,"
               "%.3f,%.3f,%.7f,%.7f,%.2f\n",
               ModelKindName(cfg.model), CompressorKindName(comp.kind), cfg.sim.workers,
               static_cast<unsigned long long>(cfg.seed), r.epoch + 1, r.loss, r.eval.loss,
               r.eval.accuracy, r.step_ms, static_cast<unsigned long long>(all.sent_bytes),
               static_cast<unsigned long long>(all.dense_bytes),
               static_cast<unsigned long long>(t.pulled_bytes), conv.rate(), fc.rate(),
               bias.rate(), all.rate(), payload_rate(conv), payload_rate(fc), density(conv),
               density(fc), r.elapsed_s);
  std::fflush(csv);
}

// Every worker runs one epoch on its own thread; returns the mean loss and the slowest time.
absl::Status RunEpochOnAllWorkers(const Config& cfg, std::vector<Trainer>& trainers, int epoch,
                                  int steps, int64_t* global_step, double* loss,
                                  double* seconds) {
  std::vector<absl::StatusOr<EpochStats>> results(cfg.sim.workers, EpochStats{});
  std::vector<int64_t> steps_at(cfg.sim.workers, *global_step);
  {
    std::vector<std::thread> threads;
    for (int w = 0; w < cfg.sim.workers; ++w) {
      threads.emplace_back(
          [&, w] { results[w] = trainers[w].RunEpoch(epoch, steps, &steps_at[w]); });
    }
    for (std::thread& t : threads) t.join();
  }
  *loss = 0.0;
  *seconds = 0.0;
  for (const auto& r : results) {
    ADAPS_RETURN_IF_ERROR(r.status());
    *loss += r->mean_loss / cfg.sim.workers;
    *seconds = std::max(*seconds, r->seconds);
  }
  *global_step = steps_at[0];
  return absl::OkStatus();
}

absl::Status Run() {
  ADAPS_ASSIGN_OR_RETURN(Config cfg, LoadConfig());
  LogConfig(cfg);
  ADAPS_ASSIGN_OR_RETURN(Dataset train, LoadFashionMnist(cfg.data_dir, /*train=*/true));
  ADAPS_ASSIGN_OR_RETURN(Dataset test, LoadFashionMnist(cfg.data_dir, /*train=*/false));
  ADAPS_ASSIGN_OR_RETURN(auto shards,
                         ShardIndices(train.count, cfg.sim.workers, cfg.seed, cfg.train_limit));
  size_t smallest = shards[0].size(), total = 0;
  for (const auto& s : shards) {
    smallest = std::min(smallest, s.size());
    total += s.size();
  }
  const int steps = StepsPerEpoch(smallest, cfg.batch);
  if (steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("shards of ", smallest, " images hold no full batch of ", cfg.batch));
  }

  if (cfg.cosine) cfg.sim.decay_steps = static_cast<int64_t>(steps) * cfg.epochs;
  std::vector<std::unique_ptr<Model>> models;
  for (int w = 0; w < cfg.sim.workers; ++w) models.push_back(Model::Create(cfg.model, cfg.seed));
  ADAPS_ASSIGN_OR_RETURN(auto cluster, SimulatedCluster::Create(cfg.sim, models[0]->params()));
  std::vector<Trainer> trainers;
  for (int w = 0; w < cfg.sim.workers; ++w) {
    trainers.emplace_back(models[w].get(), cluster->endpoint(w), &train,
                          ShardSampler(shards[w], cfg.seed, w), cfg.batch);
  }
  PrintTensors(cfg, *models[0], *cluster, total, steps, test.count);
  ADAPS_ASSIGN_OR_RETURN(std::FILE* csv, OpenCsv(cfg.csv));

  int64_t global_step = 0;
  double total_seconds = 0.0;
  EpochReport report;
  const absl::Time run_start = absl::Now();
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    double seconds = 0.0;
    absl::Status st =
        RunEpochOnAllWorkers(cfg, trainers, epoch, steps, &global_step, &report.loss, &seconds);
    if (st.ok()) {
      auto eval = Evaluate(*models[0], test);
      st = eval.status();
      if (eval.ok()) report.eval = *eval;
    }
    if (!st.ok()) {
      if (csv != nullptr) std::fclose(csv);
      return st;
    }
    total_seconds += seconds;
    report.epoch = epoch;
    report.step_ms = 1e3 * seconds / steps;
    report.traffic = cluster->traffic();
    report.elapsed_s = absl::ToDoubleSeconds(absl::Now() - run_start);
    PrintEpoch(cfg, report, csv);
  }
  if (csv != nullptr) std::fclose(csv);
  const KindTraffic all = cluster->traffic().Total();
  std::printf(
      "final: model %s compressor %s workers %d epochs %d  test_acc %.4f  "
      "pushed %s instead of %s dense (%.1fx less, %s saved)  train time %.1f s\n",
      ModelKindName(cfg.model), CompressorKindName(cfg.sim.compression.kind), cfg.sim.workers,
      cfg.epochs, report.eval.accuracy, Megabytes(all.sent_bytes).c_str(),
      Megabytes(all.dense_bytes).c_str(), all.rate(),
      Megabytes(all.dense_bytes - all.sent_bytes).c_str(), total_seconds);
  return absl::OkStatus();
}

}  // namespace
}  // namespace adaps::trainer

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains the MLP or CNN on Fashion-MNIST with simulated data-parallel workers that push "
      "compressed gradients; prints one line per epoch.");
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = adaps::trainer::Run();
  if (!s.ok()) {
    spdlog::error("[adaps-train-sim] {}", s.ToString());
    return 1;
  }
  return 0;
}
