// A test's view of a role's metrics endpoint: GET /metrics over loopback and the value of a
// series in the text it returns (Prometheus exposition format).
#ifndef ADAPS_TESTS_COMMON_METRICS_HTTP_H_
#define ADAPS_TESTS_COMMON_METRICS_HTTP_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace adaps {
namespace testing {

// GET http://127.0.0.1:port/path; the whole response (status line, headers, body), empty
// when it cannot be fetched.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t got;
      while ((got = read(fd, buf, sizeof(buf))) > 0) response.append(buf, got);
    }
  }
  close(fd);
  return response;
}

// The body of GET http://127.0.0.1:port/metrics; empty when it cannot be fetched.
inline std::string ScrapeMetrics(int port) {
  const std::string response = HttpGet(port, "/metrics");
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.1 200", 0) != 0 || body == std::string::npos) return "";
  return response.substr(body + 4);
}

// The sum over the series `name` whose labels include every one of `labels`; -1 when no
// series matches.
inline double MetricValue(const std::string& text, absl::string_view name,
                          const std::map<std::string, std::string>& labels = {}) {
  double sum = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t end = line.find_first_of("{ ");
    if (end == absl::string_view::npos || line.substr(0, end) != name) continue;
    bool match = true;
    for (const auto& [key, value] : labels) {
      if (line.find(absl::StrCat(key, "=\"", value, "\"")) == absl::string_view::npos) {
        match = false;
      }
    }
    double v = 0;
    if (!match || !absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) continue;
    sum += v;
    found = true;
  }
  return found ? sum : -1;
}

}  // namespace testing
}  // namespace adaps

#endif  // ADAPS_TESTS_COMMON_METRICS_HTTP_H_
