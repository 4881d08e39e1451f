// adaps-codec-bench: speed of the AdaComp codec against the memory-bandwidth limit.
//
// All figures use one core (the benchmarks are single-threaded) and CPU time. Every compress
// variant is reported both in elements/s and as a ratio to a plain pass over the same bytes
// (r[i] += g[i]: read 8 B, write 4 B per element, the DESIGN.md section 1 'Cost'), measured
// in the same run, so the ratio survives a noisy, shared machine better than the raw rate.
//
// Input: the bench/gradient_stream.h stream with default options (Gaussian background,
// heavy log-normal coordinates, AR(1) rho=0.9 between steps), on which AdaComp sends about
// 1% of the elements at T=500 and about 4% at T=50. kSteps consecutive steps are generated
// up front and cycled; residues are warmed up before timing so the density is the steady one.
//
// After Google Benchmark's own output, a summary table with the targets of issue 2.
// Extra flag (before or after benchmark flags): --elements=N (default 25000000).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gradient_stream.h"
#include "benchmark/benchmark.h"
#include "common/compressor.h"
#include "common/wire_codec.h"

namespace adaps {
namespace {

constexpr int kSteps = 4;
constexpr int kWarmupSteps = 12;
constexpr uint32_t kBinSizes[] = {50, 500};
constexpr double kTopKFraction = 0.001;

size_t g_elements = 25'000'000;

// Everything the benchmarks share, built once, outside any timed region.
struct Data {
  size_t n = 0;
  std::vector<std::vector<float>> grads;  // kSteps consecutive steps of the stream
  // Per bin size: a steady-state residue and a representative update with its encodings.
  struct PerBin {
    std::unique_ptr<SliceState> state;
    CompressedUpdate update;
    std::vector<uint8_t> rice;
    std::vector<uint8_t> plain;
  };
  std::map<uint32_t, PerBin> per_bin;
};

Data& GetData() {
  static Data* data = [] {
    auto* d = new Data;
    d->n = g_elements;
    bench::GradientStream stream(bench::GradientStream::Tuned1Percent(d->n, 42));
    d->grads.assign(kSteps, std::vector<float>(d->n));
    for (auto& g : d->grads) stream.Next(absl::MakeSpan(g));
    for (uint32_t t : kBinSizes) {
      Data::PerBin& pb = d->per_bin[t];
      pb.state = std::make_unique<SliceState>(d->n);
      CompressorOptions o;
      o.bin_size = t;
      auto c = MakeCompressor(o);
      for (int s = 0; s < kWarmupSteps; ++s) {
        if (!c.ok() || !(*c)->Compress(d->grads[s % kSteps], *pb.state, pb.update).ok()) {
          std::fprintf(stderr, "warm-up compress failed\n");
          std::exit(1);
        }
      }
      if (!EncodeUpdate(pb.update, IndexCoding::kRice, &pb.rice).ok() ||
          !EncodeUpdate(pb.update, IndexCoding::kPlain32, &pb.plain).ok()) {
        std::fprintf(stderr, "warm-up encode failed\n");
        std::exit(1);
      }
    }
    return d;
  }();
  return *data;
}

void SetElementCounters(benchmark::State& state, size_t n) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n) *
                          12);
}

// The bandwidth reference: what AdaComp's one pass must at least move.
__attribute__((noinline)) void PlainPass(const float* g, float* r, size_t n) {
  for (size_t i = 0; i < n; ++i) r[i] += g[i];
}

void BM_PlainPass(benchmark::State& state) {
  Data& d = GetData();
  std::vector<float> r(d.n, 0.0f);
  size_t k = 0;
  for (auto _ : state) {
    PlainPass(d.grads[k++ % kSteps].data(), r.data(), d.n);
    benchmark::ClobberMemory();
  }
  SetElementCounters(state, d.n);
}

void BM_AdaCompCompress(benchmark::State& state, uint32_t t) {
  Data& d = GetData();
  Data::PerBin& pb = d.per_bin[t];
  CompressorOptions o;
  o.bin_size = t;
  auto c = MakeCompressor(o);
  CompressedUpdate u;
  size_t k = 0;
  double sent = 0;
  for (auto _ : state) {
    const absl::Status s = (*c)->Compress(d.grads[k++ % kSteps], *pb.state, u);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    sent += static_cast<double>(u.indices.size());
  }
  SetElementCounters(state, d.n);
  state.counters["density"] =
      sent / (static_cast<double>(state.iterations()) * static_cast<double>(d.n));
}

void BM_AdaCompFused(benchmark::State& state, uint32_t t, bool portable) {
  if (!portable && !internal::AdaCompHasAvx2()) {
    state.SkipWithError("this CPU has no AVX2");
    return;
  }
  Data& d = GetData();
  Data::PerBin& pb = d.per_bin[t];
  std::vector<float> gmax;
  CompressedUpdate u;
  size_t k = 0;
  double sent = 0;
  for (auto _ : state) {
    internal::AdaCompCompressFinite(d.grads[k++ % kSteps], pb.state->residue(), t, gmax, u,
                                    portable);
    sent += static_cast<double>(u.indices.size());
  }
  SetElementCounters(state, d.n);
  state.counters["density"] =
      sent / (static_cast<double>(state.iterations()) * static_cast<double>(d.n));
}

void BM_TopK(benchmark::State& state) {
  Data& d = GetData();
  CompressorOptions o;
  o.kind = CompressorKind::kTopK;
  o.topk_fraction = kTopKFraction;
  auto c = MakeCompressor(o);
  SliceState residue(d.n);
  CompressedUpdate u;
  size_t k = 0;
  for (auto _ : state) {
    const absl::Status s = (*c)->Compress(d.grads[k++ % kSteps], residue, u);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  SetElementCounters(state, d.n);
}

void SetCodecCounters(benchmark::State& state, const Data& d, const Data::PerBin& pb,
                      size_t encoded_bytes) {
  const auto iters = static_cast<double>(state.iterations());
  const auto sent = static_cast<double>(pb.update.indices.size());
  state.SetItemsProcessed(static_cast<int64_t>(iters * sent));
  state.counters["dense_el/s"] =
      benchmark::Counter(iters * static_cast<double>(d.n), benchmark::Counter::kIsRate);
  state.counters["bits/el"] = BitsPerSentElement(pb.update, encoded_bytes);
  state.counters["density"] = sent / static_cast<double>(d.n);
}

void BM_Encode(benchmark::State& state, uint32_t t, IndexCoding coding) {
  Data& d = GetData();
  const Data::PerBin& pb = d.per_bin[t];
  std::vector<uint8_t> bytes;
  for (auto _ : state) {
    const absl::Status s = EncodeUpdate(pb.update, coding, &bytes);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(bytes.data());
  }
  SetCodecCounters(state, d, pb, bytes.size());
}

void BM_DecodeAdd(benchmark::State& state, uint32_t t, IndexCoding coding) {
  Data& d = GetData();
  const Data::PerBin& pb = d.per_bin[t];
  const std::vector<uint8_t>& bytes = coding == IndexCoding::kRice ? pb.rice : pb.plain;
  std::vector<float> dst(d.n, 0.0f);
  for (auto _ : state) {
    const absl::Status s = DecodeAdd(bytes, 0.5f, absl::MakeSpan(dst));
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    benchmark::ClobberMemory();
  }
  SetCodecCounters(state, d, pb, bytes.size());
}

// Collects every iteration run's counters by name, for the summary (median over repetitions).
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

  // Median of a counter of a benchmark; NaN when absent.
  double Get(const std::string& name, const std::string& counter) const {
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

const char* CodingName(IndexCoding c) { return c == IndexCoding::kRice ? "rice" : "plain32"; }

void RegisterAll() {
  benchmark::RegisterBenchmark("plain_pass", BM_PlainPass)->Unit(benchmark::kMillisecond);
  for (uint32_t t : kBinSizes) {
    const std::string ts = absl::StrCat("/T:", t);
    benchmark::RegisterBenchmark(("adacomp_compress" + ts).c_str(), BM_AdaCompCompress, t)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("adacomp_fused_avx2" + ts).c_str(), BM_AdaCompFused, t, false)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("adacomp_fused_portable" + ts).c_str(), BM_AdaCompFused, t,
                                 true)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("topk/0.1%", BM_TopK)->Unit(benchmark::kMillisecond);
  for (uint32_t t : kBinSizes) {
    for (IndexCoding c : {IndexCoding::kRice, IndexCoding::kPlain32}) {
      const std::string suffix = absl::StrCat("_", CodingName(c), "/T:", t);
      benchmark::RegisterBenchmark(("encode" + suffix).c_str(), BM_Encode, t, c)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("decode_add" + suffix).c_str(), BM_DecodeAdd, t, c)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

void PrintSummary(const SummaryReporter& rep) {
  const double plain = rep.Get("plain_pass", "items_per_second");
  const double topk = rep.Get("topk/0.1%", "items_per_second");
  std::printf("\n== Summary: %zu floats, one core, CPU time, median over repetitions ==\n",
              g_elements);
  std::printf("AdaComp kernel: %s\n", internal::AdaCompHasAvx2() ? "AVX2" : "portable");
  std::printf("%-28s %10s %10s %10s %9s\n", "compress", "G el/s", "vs plain", "vs top-k",
              "density");
  std::printf("%-28s %10.3f %10.2f %10s %9s\n", "plain pass r+=g (12 B/el)", plain / 1e9, 1.0,
              "", "");
  std::printf("%-28s %10.3f %10.2f %10.2f %9s\n", "top-k 0.1% (exact)", topk / 1e9,
              topk / plain, 1.0, "0.100%");
  std::map<uint32_t, double> full;
  for (uint32_t t : kBinSizes) {
    for (const char* variant : {"compress", "fused_avx2", "fused_portable"}) {
      const std::string name = absl::StrCat("adacomp_", variant, "/T:", t);
      const double v = rep.Get(name, "items_per_second");
      if (std::string(variant) == "compress") full[t] = v;
      std::printf("%-28s %10.3f %10.2f %10.1f %8.3f%%\n", name.c_str(), v / 1e9, v / plain,
                  v / topk, 100.0 * rep.Get(name, "density"));
    }
  }
  std::printf("\n%-24s %12s %14s %9s %9s\n", "wire codec", "M sent el/s", "G dense el/s",
              "bits/el", "density");
  for (uint32_t t : kBinSizes) {
    for (const char* op : {"encode", "decode_add"}) {
      for (IndexCoding c : {IndexCoding::kRice, IndexCoding::kPlain32}) {
        const std::string name = absl::StrCat(op, "_", CodingName(c), "/T:", t);
        std::printf("%-24s %12.1f %14.2f %9.2f %8.3f%%\n", name.c_str(),
                    rep.Get(name, "items_per_second") / 1e6, rep.Get(name, "dense_el/s") / 1e9,
                    rep.Get(name, "bits/el"), 100.0 * rep.Get(name, "density"));
      }
    }
  }
  const double bits_1pct = rep.Get("encode_rice/T:500", "bits/el");
  std::printf("\ntargets (issue 2):\n");
  auto line = [](const char* what, double got, double want, const char* unit) {
    std::printf("  %-44s %8.2f %-8s (target >= %.2f) %s\n", what, got, unit, want,
                got >= want ? "MET" : "MISSED");
  };
  line("AdaComp compress T=50", full[50] / 1e9, 0.6, "G el/s");
  line("AdaComp compress T=500", full[500] / 1e9, 1.0, "G el/s");
  line("AdaComp T=50 / top-k 0.1%", full[50] / topk, 8.0, "x");
  line("AdaComp T=500 / top-k 0.1%", full[500] / topk, 8.0, "x");
  std::printf("  %-44s %8.2f %-8s (target <= 12, density %.2f%%) %s\n",
              "rice bits per sent element at ~1% density", bits_1pct, "bits",
              100.0 * rep.Get("encode_rice/T:500", "density"), bits_1pct <= 12.0 ? "MET" : "MISSED");
}

}  // namespace
}  // namespace adaps

int main(int argc, char** argv) {
  // Take out our own flag, then hand the rest to Google Benchmark.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const char* kFlag = "--elements=";
    if (i > 0 && std::strncmp(argv[i], kFlag, std::strlen(kFlag)) == 0) {
      adaps::g_elements = std::strtoull(argv[i] + std::strlen(kFlag), nullptr, 10);
      continue;
    }
    args.push_back(argv[i]);
  }
  int new_argc = static_cast<int>(args.size());
  benchmark::Initialize(&new_argc, args.data());
  if (benchmark::ReportUnrecognizedArguments(new_argc, args.data())) return 1;
  if (adaps::g_elements < 1000) {
    std::fprintf(stderr, "--elements must be at least 1000\n");
    return 1;
  }
  adaps::RegisterAll();
  adaps::SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  adaps::PrintSummary(reporter);
  benchmark::Shutdown();
  return 0;
}
