#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/metrics_http.h"

namespace adaps {
namespace {

namespace n = metric_names;

using testing::HttpGet;

std::unique_ptr<Metrics> Enabled(const std::string& port_file = "") {
  MetricsOptions o;
  o.port = 0;
  o.host = "127.0.0.1";
  o.role = "worker";
  o.rank = 3;
  o.port_file = port_file;
  auto m = Metrics::Create(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

TEST(Metrics, DisabledServesNothingAndHandsOutNoOpHandles) {
  auto m = Metrics::Create(MetricsOptions{});  // port -1: the default
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE((*m)->enabled());
  EXPECT_EQ((*m)->port(), 0);
  Counter c = (*m)->GetCounter(n::kPushesTotal, {{"tensor", "fc1"}});
  c.Increment(5);
  EXPECT_FALSE(c.enabled());
  EXPECT_EQ(c.Value(), 0);
  (*m)->GetHistogram(n::kStepSeconds).Observe(0.5);
  EXPECT_EQ((*m)->Scrape(), "");
  EXPECT_TRUE((*m)->status().ok());
}

TEST(Metrics, ServesCountersGaugesAndHistogramsOverHttpWithConstantLabels) {
  auto m = Enabled();
  ASSERT_NE(m, nullptr);
  ASSERT_GT(m->port(), 0);
  m->GetCounter(n::kPushBytesTotal, {{"tensor", "fc1"}}).Increment(1234);
  m->GetGauge(n::kCompressionRatio, {{"tensor", "fc1"}}).Set(40);
  m->GetHistogram(n::kStepSeconds).Observe(0.25);
  const std::string response = HttpGet(m->port(), "/metrics");
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 200")) << response;
  EXPECT_TRUE(absl::StrContains(
      response, "adaps_push_bytes_total{rank=\"3\",role=\"worker\",tensor=\"fc1\"} 1234"))
      << response;
  EXPECT_TRUE(absl::StrContains(
      response, "adaps_compression_ratio{rank=\"3\",role=\"worker\",tensor=\"fc1\"} 40"))
      << response;
  EXPECT_TRUE(absl::StrContains(response, "adaps_step_seconds_count{rank=\"3\",role=\"worker\"} 1"))
      << response;
  EXPECT_TRUE(absl::StrContains(response, "# TYPE adaps_push_bytes_total counter")) << response;
}

TEST(Metrics, SameNameAndLabelsShareOneSeries) {
  auto m = Enabled();
  ASSERT_NE(m, nullptr);
  Counter a = m->GetCounter(n::kPushesTotal, {{"tensor", "fc1"}});
  Counter b = m->GetCounter(n::kPushesTotal, {{"tensor", "fc1"}});
  Counter other = m->GetCounter(n::kPushesTotal, {{"tensor", "fc2"}});
  a.Increment();
  b.Increment(2);
  EXPECT_EQ(a.Value(), 3);
  EXPECT_EQ(other.Value(), 0);
}

TEST(Metrics, PortInUseIsUnavailableNotACrash) {
  auto first = Enabled();
  ASSERT_NE(first, nullptr);
  MetricsOptions o;
  o.port = first->port();
  o.host = "127.0.0.1";
  o.role = "server";
  auto second = Metrics::Create(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), absl::StrCat(first->port())))
      << second.status();
}

TEST(Metrics, BadPortOrRoleIsInvalidArgument) {
  MetricsOptions o;
  o.port = 70000;
  o.role = "server";
  EXPECT_EQ(Metrics::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.port = 0;
  o.role = "";
  EXPECT_EQ(Metrics::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Metrics, WritesTheRealPortToThePortFile) {
  const std::string path = ::testing::TempDir() + "/metrics_port_" + std::to_string(getpid());
  auto m = Enabled(path);
  ASSERT_NE(m, nullptr);
  std::ifstream in(path);
  int port = -1;
  in >> port;
  EXPECT_EQ(port, m->port());
  std::remove(path.c_str());
}

TEST(Metrics, UnknownNameWrongTypeOrWrongLabelsGiveNoOpHandlesAndAStatus) {
  auto m = Enabled();
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->GetCounter("adaps_made_up_total").enabled());
  EXPECT_EQ(m->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(m->status().message(), "adaps_made_up_total"));

  auto fresh = Enabled();
  ASSERT_NE(fresh, nullptr);
  EXPECT_FALSE(fresh->GetGauge(n::kPushesTotal, {{"tensor", "x"}}).enabled());  // a counter
  EXPECT_FALSE(fresh->GetCounter(n::kPushesTotal, {{"shard", "x"}}).enabled());
  EXPECT_FALSE(fresh->GetCounter(n::kPushesTotal).enabled());
  EXPECT_FALSE(fresh->status().ok());
  EXPECT_EQ(fresh->Scrape().find("adaps_pushes_total{"), std::string::npos);
}

TEST(Metrics, RankSetBeforeTheFirstSeriesLabelsEverySeriesAndIsRefusedAfter) {
  auto m = Enabled();  // rank 3
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->SetRank(5).ok());
  m->GetCounter(n::kStepsTotal).Increment();
  EXPECT_TRUE(absl::StrContains(m->Scrape(), "adaps_steps_total{rank=\"5\",role=\"worker\"} 1"))
      << m->Scrape();
  const absl::Status late = m->SetRank(6);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  m->GetCounter(n::kPushesTotal, {{"tensor", "fc1"}}).Increment();
  EXPECT_TRUE(absl::StrContains(m->Scrape(), "adaps_pushes_total{rank=\"5\""));
  EXPECT_TRUE(Metrics::Disabled()->SetRank(1).ok());
}

TEST(Metrics, CatalogNamesAreUniqueAndFollowPrometheusConventions) {
  const std::regex name("adaps_[a-z_]+");
  std::set<std::string> seen;
  for (const MetricInfo& info : MetricCatalog()) {
    const std::string s = info.name;
    EXPECT_TRUE(seen.insert(s).second) << s << " twice";
    EXPECT_TRUE(std::regex_match(s, name)) << s;
    EXPECT_EQ(absl::EndsWith(s, "_total"), info.type == MetricType::kCounter) << s;
    if (info.type == MetricType::kHistogram) {
      EXPECT_TRUE(absl::EndsWith(s, "_seconds")) << s;
    }
    for (const char* label : info.labels) {
      EXPECT_NE(std::string(label), "role") << s << ": role is a constant label";
      EXPECT_NE(std::string(label), "rank") << s << ": rank is a constant label";
    }
  }
}

TEST(Metrics, EveryCatalogNameIsDocumentedInTheOperationsGuide) {
  std::ifstream in(std::string(ADAPS_SOURCE_DIR) + "/docs/operations.md");
  ASSERT_TRUE(in.good()) << "docs/operations.md is missing";
  std::stringstream doc;
  doc << in.rdbuf();
  for (const MetricInfo& info : MetricCatalog()) {
    EXPECT_TRUE(absl::StrContains(doc.str(), absl::StrCat("`", info.name, "`")))
        << info.name << " is not listed in docs/operations.md";
  }
}

}  // namespace
}  // namespace adaps
