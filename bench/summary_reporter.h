// The benchmarks' summary collector: a console reporter that also keeps every iteration
// run's counters by benchmark name, so a program can print its targets as medians over
// --benchmark_repetitions after the runs.
#ifndef ADAPS_BENCH_SUMMARY_REPORTER_H_
#define ADAPS_BENCH_SUMMARY_REPORTER_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// The main of a benchmark program: takes our own flag --elements=N out of argv (into
// `*elements`, at least `min_elements`), hands the rest to Google Benchmark, registers the
// benchmarks (`register_all()`), runs them and prints `summary(reporter)`. Returns the exit
// code: 1 for an unknown flag or too few elements.
template <typename RegisterAll, typename Summary>
int BenchmarkMain(int argc, char** argv, size_t* elements, size_t min_elements,
                  RegisterAll register_all, Summary summary) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const char* kFlag = "--elements=";
    if (i > 0 && std::strncmp(argv[i], kFlag, std::strlen(kFlag)) == 0) {
      *elements = std::strtoull(argv[i] + std::strlen(kFlag), nullptr, 10);
      continue;
    }
    args.push_back(argv[i]);
  }
  int new_argc = static_cast<int>(args.size());
  benchmark::Initialize(&new_argc, args.data());
  if (benchmark::ReportUnrecognizedArguments(new_argc, args.data())) return 1;
  if (*elements < min_elements) {
    std::fprintf(stderr, "--elements must be at least %zu\n", min_elements);
    return 1;
  }
  register_all();
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  summary(reporter);
  benchmark::Shutdown();
  return 0;
}

}  // namespace adaps

#endif  // ADAPS_BENCH_SUMMARY_REPORTER_H_
