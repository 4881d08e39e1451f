// adaps-server: one shard of the parameters. Thin: builds ServerConfig from defaults <
// config file < ADAPS_* environment < flags, then runs a Server until the scheduler says
// shutdown.
#include <string>

#include "absl/flags/flag.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/main_flags.h"
#include "common/main_util.h"
#include "common/metrics.h"
#include "server/server.h"

ABSL_FLAG(std::string, scheduler, "", "Scheduler address, e.g. tcp://127.0.0.1:5000");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on for workers");
ABSL_FLAG(int, port, 0, "TCP port; 0 lets the OS choose (the real one is registered)");
ABSL_FLAG(std::string, port_file, "", "Write the bound port here (atomically) once registered");
ABSL_FLAG(std::string, advertise, "", "Address workers should use; empty: the bound one");
ABSL_FLAG(std::string, identity, "", "Stable identity: a restarted server gets its rank back");
ABSL_FLAG(std::string, mode, "sync", "sync (every worker per step) or async (apply on arrival)");
ABSL_FLAG(std::string, optimizer, "sgd", "sum, mean, sgd, momentum, nesterov or adam");
ABSL_FLAG(double, learning_rate, 0.01, "Learning rate");
ABSL_FLAG(double, momentum, 0.9, "Momentum (momentum, nesterov)");
ABSL_FLAG(double, weight_decay, 0.0, "L2 weight decay");
ABSL_FLAG(double, beta1, 0.9, "Adam beta1");
ABSL_FLAG(double, beta2, 0.999, "Adam beta2");
ABSL_FLAG(double, epsilon, 1e-8, "Adam epsilon");
ABSL_FLAG(int, register_timeout_ms, 60000, "How long to wait for the cluster to form");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Directory of server-<rank>.ckpt: default for Checkpoint requests, the timer, restore");
ABSL_FLAG(double, checkpoint_interval_s, 0,
          "Write a checkpoint this often, in seconds (fractions too; the timer ticks every "
          "100 ms; 0: only on request)");
ABSL_FLAG(int64_t, checkpoint_every_steps, 0,
          "Also write a step checkpoint at every multiple of this step, the same steps on "
          "every server; a restart restores the latest step every server has (0: none)");
ABSL_FLAG(int, scheduler_grace_s, 60,
          "Keep serving this long without the scheduler (re-registering when it is back)");
ABSL_FLAG(uint32_t, pull_bin_size, 0,
          "AdaComp bin size of recompressed pulls: min(this, the slice's declared bin size); "
          "0: the declared one");
ABSL_FLAG(int, backup_workers, 0,
          "sync: a step completes once all but this many live workers pushed; a straggler's "
          "push is added to the next step, not dropped (not with --optimizer=mean or "
          "recompressed pulls)");
ABSL_FLAG(uint64_t, max_slice_elements, uint64_t{1} << 28,
          "Largest slice a worker may declare (elements): bounds what a client can allocate");
ABSL_FLAG(int, engine_threads, 0,
          "Threads that own the slices and do the work on them; 0: the cores this process may "
          "use (never more than slices)");
ABSL_FLAG(uint64_t, max_memory, 0,
          "Memory all slices together may take (bytes, budgeted at 32 per element); a "
          "DeclareSlice beyond it is refused. 0: half of the physical memory");
ABSL_FLAG(bool, restore, true,
          "Restore from checkpoint_dir at start when a checkpoint of this job (the scheduler's "
          "--job_id) exists; another job's is moved aside");
ABSL_FLAG(std::string, restore_from, "",
          "Restore from this checkpoint file whatever job wrote it (e.g. a .job-<id> file, or "
          "one of format 2), instead of checkpoint_dir's");

namespace {

// Every range check of the flags, before anything touches the network.
absl::Status CheckFlags() {
  return adaps::FirstError({
      adaps::CheckConnectEndpoint("scheduler", absl::GetFlag(FLAGS_scheduler)),
      adaps::CheckPort("port", absl::GetFlag(FLAGS_port)),
      absl::GetFlag(FLAGS_advertise).empty()
          ? absl::OkStatus()
          : adaps::CheckConnectEndpoint("advertise", absl::GetFlag(FLAGS_advertise)),
      adaps::CheckPositive("register_timeout_ms", absl::GetFlag(FLAGS_register_timeout_ms)),
      adaps::CheckNonNegative("checkpoint_interval_s", absl::GetFlag(FLAGS_checkpoint_interval_s)),
      adaps::CheckNonNegative("checkpoint_every_steps", absl::GetFlag(FLAGS_checkpoint_every_steps)),
      adaps::CheckPositive("scheduler_grace_s", absl::GetFlag(FLAGS_scheduler_grace_s)),
      adaps::CheckPositive("max_slice_elements", absl::GetFlag(FLAGS_max_slice_elements)),
      adaps::CheckSharedFlags(),
      adaps::CheckNonNegative("engine_threads", absl::GetFlag(FLAGS_engine_threads)),
  });
}

}  // namespace

int main(int argc, char** argv) {
  adaps::MainProgram program(
      "adaps-server", "server",
      "holds a shard of the parameters, aggregates pushes, applies the optimizer and answers "
      "pulls.");
  if (auto exit_code = program.Init(argc, argv)) return *exit_code;

  auto host = adaps::ResolveListenHost("host", absl::GetFlag(FLAGS_host));
  if (!host.ok()) return program.UsageError(host.status());
  if (auto s = CheckFlags(); !s.ok()) return program.UsageError(s);
  adaps::ServerConfig config;
  config.scheduler = absl::GetFlag(FLAGS_scheduler);
  config.bind = adaps::BindEndpoint(*host, absl::GetFlag(FLAGS_port));
  config.advertise = absl::GetFlag(FLAGS_advertise);
  config.identity = absl::GetFlag(FLAGS_identity);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "sync" && mode != "async") {
    return program.UsageError(absl::InvalidArgumentError("--mode must be sync or async"));
  }
  config.sync = mode == "sync";
  auto kind = adaps::ParseOptimizerKind(absl::GetFlag(FLAGS_optimizer));
  if (!kind.ok()) return program.UsageError(kind.status());
  config.optimizer.kind = *kind;
  config.optimizer.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_learning_rate));
  config.optimizer.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  config.optimizer.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  config.optimizer.beta1 = static_cast<float>(absl::GetFlag(FLAGS_beta1));
  config.optimizer.beta2 = static_cast<float>(absl::GetFlag(FLAGS_beta2));
  config.optimizer.epsilon = static_cast<float>(absl::GetFlag(FLAGS_epsilon));
  config.register_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_register_timeout_ms));
  config.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  config.checkpoint_interval = absl::Seconds(absl::GetFlag(FLAGS_checkpoint_interval_s));
  config.checkpoint_every_steps = static_cast<uint64_t>(absl::GetFlag(FLAGS_checkpoint_every_steps));
  config.restore = absl::GetFlag(FLAGS_restore);
  config.restore_from = absl::GetFlag(FLAGS_restore_from);
  config.max_slice_elements = absl::GetFlag(FLAGS_max_slice_elements);
  config.pull_bin_size = absl::GetFlag(FLAGS_pull_bin_size);
  config.max_memory = absl::GetFlag(FLAGS_max_memory);
  config.scheduler_grace = absl::Seconds(absl::GetFlag(FLAGS_scheduler_grace_s));
  config.engine_threads = absl::GetFlag(FLAGS_engine_threads);
  config.backup_workers = absl::GetFlag(FLAGS_backup_workers);
  config.log_level = absl::GetFlag(FLAGS_log_level);
  auto curve = adaps::ServingCurveKeysFromFlags();
  if (!curve.ok()) return program.UsageError(curve.status());
  config.curve = *std::move(curve);
  if (auto s = adaps::ValidateServerConfig(config); !s.ok()) return program.UsageError(s);

  // The rank label is set from the scheduler's view (ServerMetrics::OnView).
  const adaps::MetricsOptions metrics_options = adaps::MetricsOptionsFromFlags("server", -1);
  auto metrics = adaps::Metrics::Create(metrics_options);
  if (!metrics.ok()) {
    return absl::IsInvalidArgument(metrics.status()) ? program.UsageError(metrics.status())
                                                     : program.Fail(metrics.status());
  }

  adaps::MainProgram::CatchStopSignals();
  auto logger = adaps::MakeLogger("server", -1, config.log_level);
  logger->info("effective config: {}", program.EffectiveConfig());
  if ((*metrics)->enabled()) {
    logger->info("metrics on http://{}:{}/metrics", metrics_options.host, (*metrics)->port());
  }
  adaps::Server server(config, nullptr, metrics->get());
  if (auto s = server.Start(); !s.ok()) return program.Fail(s);
  if (auto s = adaps::WritePortFileIfSet(absl::GetFlag(FLAGS_port_file), server.endpoint());
      !s.ok()) {
    server.Stop();
    return program.Fail(s);
  }
  adaps::MainProgram::WaitForShutdownOrSignal(
      [&](absl::Duration timeout) { return server.WaitForShutdown(timeout); });
  server.Stop();
  if (!server.exit_status().ok()) return program.Fail(server.exit_status());
  return adaps::kExitOk;
}
