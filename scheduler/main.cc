// adaps-scheduler: the cluster's rendezvous point. Thin: builds SchedulerConfig from
// defaults < config file < ADAPS_* environment < flags, then runs a Scheduler.
#include <algorithm>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/main_flags.h"
#include "common/main_util.h"
#include "scheduler/scheduler.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on");
ABSL_FLAG(int, port, 0, "TCP port; 0 lets the OS choose (see --port_file)");
ABSL_FLAG(std::string, port_file, "", "Write the bound port here (atomically) once listening");
ABSL_FLAG(int, num_servers, 1, "Servers to wait for");
ABSL_FLAG(int, num_workers, 1, "Workers to wait for (the job starts when they are in)");
ABSL_FLAG(int, max_workers, 0,
          "Elastic jobs: workers that register after the job started are admitted while "
          "fewer than this many are live, and take part from the next step; 0: "
          "--num_workers (nobody joins)");
ABSL_FLAG(int, heartbeat_ms, 1000, "Heartbeat interval told to every node");
ABSL_FLAG(int, dead_timeout_ms, 30000,
          "A node silent this long is declared dead (long enough for a loaded host or a GC "
          "pause to pass; a node that comes back later is told it was declared dead)");
ABSL_FLAG(int, reform_timeout_ms, 300000,
          "After a restart (nodes register again with the ranks they had), every node of the "
          "job must be back within this long of the first; otherwise the scheduler stops the "
          "nodes that came back and exits 1 naming the missing ones");
ABSL_FLAG(std::string, admin_token, "",
          "Secret an operator's Shutdown request must carry; empty: no Shutdown request is "
          "accepted (the job ends when every worker has left)");
ABSL_FLAG(std::string, job_id, "",
          "The job's identity, in every checkpoint: servers restore only a checkpoint of the "
          "same job. Empty: a random id per start (set it to resume a job after a scheduler "
          "or whole-cluster restart)");
ABSL_FLAG(std::string, on_worker_death, "continue",
          "continue (sync steps average over the live workers) or fail (stop the cluster with "
          "an error naming the dead worker)");
ABSL_FLAG(uint64_t, split_threshold, 1 << 16,
          "Tensors with at least this many elements are split over all servers");
ABSL_FLAG(int, leave_view_window_ms, 250,
          "Workers' goodbyes within this long of the last view broadcast share the next one "
          "(a view goes to every node: one per goodbye at a large job's end is nodes^2 x "
          "goodbyes bytes); the first after a quiet spell is sent at once; 0: one per goodbye");
ABSL_FLAG(int, shutdown_grace_ms, 3000,
          "When the job ends (every worker has left), keep answering this long before "
          "exiting, so that the last workers' goodbyes are acknowledged and the servers told "
          "to stop over slow or lossy links (a stop signal cuts it short)");
ABSL_FLAG(int, shutdown_drain_ms, 30000,
          "After the grace, keep running while the last messages to the nodes are not yet "
          "acknowledged by them (on a 1 Mbit/s link the views of a 32-node job's last "
          "goodbyes take seconds), up to this long from the job's end, when the job ended "
          "well (a job that failed may have unreachable nodes); 0: exit after the grace");

int main(int argc, char** argv) {
  adaps::MainProgram program(
      "adaps-scheduler", "scheduler",
      "waits for the servers and workers, assigns ranks and tensor slices, runs barriers and "
      "heartbeats, and coordinates shutdown.");
  if (auto exit_code = program.Init(argc, argv)) return *exit_code;

  auto host = adaps::ResolveListenHost("host", absl::GetFlag(FLAGS_host));
  if (!host.ok()) return program.UsageError(host.status());
  if (auto s = adaps::FirstError({
          adaps::CheckPort("port", absl::GetFlag(FLAGS_port)),
          adaps::CheckPositive("num_servers", absl::GetFlag(FLAGS_num_servers)),
          adaps::CheckPositive("num_workers", absl::GetFlag(FLAGS_num_workers)),
          adaps::CheckPositive("heartbeat_ms", absl::GetFlag(FLAGS_heartbeat_ms)),
          adaps::CheckPositive("dead_timeout_ms", absl::GetFlag(FLAGS_dead_timeout_ms)),
          adaps::CheckPositive("reform_timeout_ms", absl::GetFlag(FLAGS_reform_timeout_ms)),
          adaps::CheckPositive("split_threshold", absl::GetFlag(FLAGS_split_threshold)),
          absl::GetFlag(FLAGS_shutdown_grace_ms) >= 0
              ? absl::OkStatus()
              : absl::InvalidArgumentError("--shutdown_grace_ms must be 0 or more"),
          absl::GetFlag(FLAGS_leave_view_window_ms) >= 0
              ? absl::OkStatus()
              : absl::InvalidArgumentError("--leave_view_window_ms must be 0 or more"),
          absl::GetFlag(FLAGS_shutdown_drain_ms) >= 0
              ? absl::OkStatus()
              : absl::InvalidArgumentError("--shutdown_drain_ms must be 0 or more"),
          adaps::CheckSharedFlags(),
      });
      !s.ok()) {
    return program.UsageError(s);
  }
  adaps::SchedulerConfig config;
  config.bind = adaps::BindEndpoint(*host, absl::GetFlag(FLAGS_port));
  config.num_servers = absl::GetFlag(FLAGS_num_servers);
  config.num_workers = absl::GetFlag(FLAGS_num_workers);
  config.max_workers = absl::GetFlag(FLAGS_max_workers);
  config.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  config.dead_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_dead_timeout_ms));
  config.reform_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_reform_timeout_ms));
  config.leave_view_window = absl::Milliseconds(absl::GetFlag(FLAGS_leave_view_window_ms));
  const std::string on_death = absl::GetFlag(FLAGS_on_worker_death);
  if (on_death != "continue" && on_death != "fail") {
    return program.UsageError(
        absl::InvalidArgumentError("--on_worker_death must be continue or fail"));
  }
  config.on_worker_death = on_death == "fail" ? adaps::SchedulerConfig::OnWorkerDeath::kFail
                                              : adaps::SchedulerConfig::OnWorkerDeath::kContinue;
  config.split_threshold = absl::GetFlag(FLAGS_split_threshold);
  config.log_level = absl::GetFlag(FLAGS_log_level);
  config.admin_token = absl::GetFlag(FLAGS_admin_token);
  config.job_id = absl::GetFlag(FLAGS_job_id);
  auto curve = adaps::ServingCurveKeysFromFlags();
  if (!curve.ok()) return program.UsageError(curve.status());
  config.curve = *std::move(curve);
  if (auto s = adaps::ValidateSchedulerConfig(config); !s.ok()) return program.UsageError(s);

  const adaps::MetricsOptions metrics_options = adaps::MetricsOptionsFromFlags("scheduler", 0);
  auto metrics = adaps::Metrics::Create(metrics_options);
  if (!metrics.ok()) return program.Fail(metrics.status());

  adaps::MainProgram::CatchStopSignals();
  adaps::Scheduler scheduler(config, nullptr, metrics->get());
  auto logger = adaps::MakeLogger("scheduler", 0, config.log_level);
  logger->info("effective config: {}", program.EffectiveConfig());
  if ((*metrics)->enabled()) {
    logger->info("metrics on http://{}:{}/metrics", metrics_options.host, (*metrics)->port());
  }
  if (auto s = scheduler.Start(); !s.ok()) return program.Fail(s);
  const std::string endpoint = scheduler.endpoint();
  logger->info("bound {} port {}", endpoint, endpoint.substr(endpoint.rfind(':') + 1));
  if (auto s = adaps::WritePortFileIfSet(absl::GetFlag(FLAGS_port_file), endpoint); !s.ok()) {
    scheduler.Stop();
    return program.Fail(s);
  }
  const int sig = adaps::MainProgram::WaitForShutdownOrSignal(
      [&](absl::Duration timeout) { return scheduler.WaitForShutdown(timeout); });
  if (sig != 0) logger->info("signal {}: stopping", sig);
  // The job ended: the Ack of the last goodbyes and the Shutdown to every node are queued.
  // Closing at once lost them on a slow link (16 workers with a server beside each on 10
  // Mbit/s links: half the workers waited out their goodbye's deadline and every server gave
  // up on a silent scheduler after 60 s, with an error): a TCP connection in retransmission
  // back-off needs seconds, and closing a socket with unread input discards what it holds.
  // So the transport keeps running (answering late goodbyes) for the grace, and then while
  // what it sent is not acknowledged yet (up to the drain limit), then stops.
  const absl::Duration grace =
      sig == 0 ? absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)) : absl::ZeroDuration();
  const absl::Duration drain = sig == 0 && scheduler.exit_status().ok()
                                   ? absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_drain_ms))
                                   : absl::ZeroDuration();
  const absl::Time ended = absl::Now();
  int64_t unacknowledged = 0;
  if (adaps::MainProgram::DrainUnlessSignalled(std::max(grace, absl::Milliseconds(100)),
                                               std::max(grace, drain), &unacknowledged) != 0) {
    logger->info("signal during the shutdown grace: stopping");
  } else if (unacknowledged > 0) {
    logger->warn("exiting with {} bytes to the nodes not acknowledged after {} "
                 "(--shutdown_drain_ms): a node may miss its Shutdown",
                 unacknowledged, absl::FormatDuration(absl::Now() - ended));
  } else if (absl::Now() - ended > grace + absl::Seconds(1)) {
    logger->info("the last messages to the nodes took {} to be acknowledged",
                 absl::FormatDuration(absl::Now() - ended));
  }
  scheduler.Stop();
  // Non-zero unless the job completed (a worker died under the fail policy, a node is
  // still dead at the end, an operator's Shutdown with an error code).
  if (sig == 0 && !scheduler.exit_status().ok()) return program.Fail(scheduler.exit_status());
  return adaps::kExitOk;
}
