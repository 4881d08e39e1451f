// The benchmarks' summary collector: a console reporter that also keeps every iteration
// run's counters by benchmark name, so a program can print its targets as medians over
// --benchmark_repetitions after the runs.
#ifndef ADAPS_BENCH_SUMMARY_REPORTER_H_
#define ADAPS_BENCH_SUMMARY_REPORTER_H_

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace adaps {

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      auto& m = values_[run.run_name.str()];
      for (const auto& [key, counter] : run.counters) m[key].push_back(counter.value);
    }
  }

  // Median of a counter of a benchmark (items/s by default); NaN when absent.
  double Get(const std::string& name, const std::string& counter = "items_per_second") const {
    auto it = values_.find(name);
    if (it == values_.end()) return std::nan("");
    auto jt = it->second.find(counter);
    if (jt == it->second.end() || jt->second.empty()) return std::nan("");
    std::vector<double> v = jt->second;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }

 private:
  std::map<std::string, std::map<std::string, std::vector<double>>> values_;
};

}  // namespace adaps

#endif  // ADAPS_BENCH_SUMMARY_REPORTER_H_
