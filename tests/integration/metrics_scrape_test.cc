// The live metrics of a running cluster, scraped over HTTP: a real adaps-scheduler and two
// real adaps-server processes (--metrics_port=0), a library worker in this process
// (WorkerOptions::metrics_port = 0). After N steps the worker's series equal its own
// Worker::Traffic counters, and the servers' push series add up to the same bytes.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "adaps/worker.h"
#include "gtest/gtest.h"
#include "tests/common/metrics_http.h"
#include "tests/integration/cluster_harness.h"

namespace adaps {
namespace {

using testing::Process;
using testing::WaitForPortFile;

// The body of a role's /metrics on `port` (a string, as its port file holds it).
std::string Scrape(const std::string& port) {
  int port_number = 0;
  return absl::SimpleAtoi(port, &port_number) ? testing::ScrapeMetrics(port_number) : "";
}

double Value(const std::string& text, const std::string& name,
             const std::map<std::string, std::string>& labels = {}) {
  return testing::MetricValue(text, name, labels);
}

class MetricsScrape : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    scheduler_ = std::make_unique<Process>(
        ADAPS_SCHEDULER_BIN,
        std::vector<std::string>{"--num_servers=2", "--num_workers=1", "--heartbeat_ms=100",
                                 "--port_file=" + dir_ + "/port", "--log_level=warn",
                                 "--split_threshold=1000"},
        dir_ + "/scheduler.log");
    const std::string port = WaitForPortFile(dir_ + "/port", absl::Seconds(10));
    ASSERT_FALSE(port.empty()) << scheduler_->Log();
    address_ = "tcp://127.0.0.1:" + port;
    for (int s = 0; s < 2; ++s) {
      servers_.push_back(std::make_unique<Process>(
          ADAPS_SERVER_BIN,
          std::vector<std::string>{"--scheduler=" + address_, "--log_level=warn",
                                   "--metrics_port=0", "--metrics_host=127.0.0.1",
                                   absl::StrCat("--metrics_port_file=", dir_, "/server", s)},
          absl::StrCat(dir_, "/server", s, ".log")));
    }
  }

  std::string dir_, address_;
  std::unique_ptr<Process> scheduler_;
  std::vector<std::unique_ptr<Process>> servers_;
};

TEST_F(MetricsScrape, CountersAgreeWithTheWorkersOwnTrafficCounters) {
  WorkerOptions options;
  options.scheduler = address_;
  options.register_timeout = absl::Seconds(20);
  options.log_level = "warn";
  options.metrics_port = 0;
  options.metrics_host = "127.0.0.1";
  options.metrics_port_file = dir_ + "/worker";
  auto worker = Worker::Create(options);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::string worker_port = WaitForPortFile(dir_ + "/worker", absl::Seconds(5));
  ASSERT_FALSE(worker_port.empty());

  // "fc" is split over both servers (split_threshold 1000); "bias" is sent dense.
  TensorSpec fc{"fc", {5000}, 50, Compression::kAdaComp};
  TensorSpec bias{"bias", {10}, 50, Compression::kDense};
  std::vector<float> fc_values(5000, 0.0f), bias_values(10, 0.0f);
  ASSERT_TRUE((*worker)->Declare(fc, absl::MakeSpan(fc_values)).ok());
  ASSERT_TRUE((*worker)->Declare(bias, absl::MakeSpan(bias_values)).ok());
  constexpr int kSteps = 5;
  std::vector<float> grad(5000);
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = ((i * 7919 + step * 31) % 200) / 100.0f - 1;
    auto a = (*worker)->PushPull("fc", grad, absl::MakeSpan(fc_values));
    auto b = (*worker)->PushPull("bias", absl::MakeSpan(grad).subspan(0, 10),
                                 absl::MakeSpan(bias_values));
    ASSERT_TRUE(a.get().ok());
    ASSERT_TRUE(b.get().ok());
  }

  const std::string w = Scrape(worker_port);
  ASSERT_FALSE(w.empty());
  std::vector<std::string> server_text;
  for (int s = 0; s < 2; ++s) {
    const std::string port = WaitForPortFile(absl::StrCat(dir_, "/server", s), absl::Seconds(5));
    server_text.push_back(Scrape(port));
    ASSERT_FALSE(server_text.back().empty()) << servers_[s]->Log();
  }
  for (const char* name : {"fc", "bias"}) {
    SCOPED_TRACE(name);
    auto traffic = (*worker)->Traffic(name);
    ASSERT_TRUE(traffic.ok());
    const std::map<std::string, std::string> t = {
        {"tensor", name}, {"role", "worker"}, {"rank", "0"}};
    EXPECT_EQ(Value(w, "adaps_pushes_total", t), traffic->pushes);
    EXPECT_EQ(Value(w, "adaps_pulls_total", t), traffic->pulls);
    EXPECT_EQ(Value(w, "adaps_push_bytes_total", t), traffic->push_wire_bytes);
    EXPECT_EQ(Value(w, "adaps_push_dense_bytes_total", t), traffic->push_dense_bytes);
    EXPECT_EQ(Value(w, "adaps_pull_bytes_total", t), traffic->pull_wire_bytes);
    EXPECT_EQ(Value(w, "adaps_pull_dense_bytes_total", t), traffic->pull_dense_bytes);
    EXPECT_GT(Value(w, "adaps_compression_ratio", t), 0);
    EXPECT_GT(Value(w, "adaps_density", t), 0);
    EXPECT_LE(Value(w, "adaps_density", t), 1);
    // What the worker sent is what the servers received, byte for byte.
    const std::map<std::string, std::string> s = {{"tensor", name}, {"role", "server"}};
    // (A server without a slice of the tensor has no such series: -1, counted as 0.)
    auto both = [&](const char* metric) {
      return std::max(0.0, Value(server_text[0], metric, s)) +
             std::max(0.0, Value(server_text[1], metric, s));
    };
    EXPECT_EQ(both("adaps_server_push_bytes_total"), traffic->push_wire_bytes);
    EXPECT_EQ(both("adaps_server_push_dense_bytes_total"), traffic->push_dense_bytes);
  }
  EXPECT_GT(Value(w, "adaps_compression_ratio", {{"tensor", "fc"}}), 1.5);
  EXPECT_LT(Value(w, "adaps_density", {{"tensor", "fc"}}), 1);
  EXPECT_EQ(Value(w, "adaps_density", {{"tensor", "bias"}}), 1);
  EXPECT_EQ(Value(w, "adaps_steps_total"), kSteps);
  EXPECT_EQ(Value(w, "adaps_step_seconds_count"), kSteps);
  EXPECT_EQ(Value(w, "adaps_step_phase_seconds_count", {{"phase", "compress"}}), kSteps);
  EXPECT_EQ(Value(w, "adaps_step_phase_seconds_count", {{"phase", "wait"}}), kSteps);
  EXPECT_EQ(Value(w, "adaps_step_phase_seconds_count", {{"phase", "decode"}}), kSteps);
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(absl::StrCat("server ", s));
    const std::string& text = server_text[s];
    EXPECT_EQ(Value(text, "adaps_server_live_workers"), 1);
    // Both servers hold a slice of "fc": one step per worker step each.
    EXPECT_EQ(Value(text, "adaps_server_steps_total", {{"tensor", "fc"}}), kSteps);
    EXPECT_EQ(Value(text, "adaps_server_pushes_total", {{"tensor", "fc"}}), kSteps);
    EXPECT_EQ(Value(text, "adaps_server_step_work_seconds_count", {{"tensor", "fc"}}), kSteps);
    EXPECT_GE(Value(text, "adaps_checkpoint_age_seconds"), 0);
    EXPECT_EQ(Value(text, "adaps_rejected_messages_total", {{"reason", "malformed"}}), 0);
  }
  ASSERT_TRUE((*worker)->Stop().ok());
}

TEST_F(MetricsScrape, AServerRefusesAMetricsPortInUseAtStart) {
  const std::string port = WaitForPortFile(dir_ + "/server0", absl::Seconds(20));
  ASSERT_FALSE(port.empty()) << servers_[0]->Log();
  Process clash(ADAPS_SERVER_BIN,
                {"--scheduler=" + address_, "--metrics_port=" + port, "--metrics_host=127.0.0.1"},
                dir_ + "/clash.log");
  EXPECT_EQ(clash.WaitExit(absl::Seconds(10)), 1) << clash.Log();
  EXPECT_NE(clash.Log().find("metrics: cannot serve"), std::string::npos) << clash.Log();
}

}  // namespace
}  // namespace adaps
