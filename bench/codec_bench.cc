// adaps-codec-bench: speed of the AdaComp codec against the memory-bandwidth limit.
//
// All figures use one core (the benchmarks are single-threaded) and CPU time. Every compress
// variant is reported both in elements/s and as a ratio to a plain pass over the same bytes
// (r[i] += g[i]: read 8 B, write 4 B per element, docs/algorithm.md, 'Cost'), measured
// in the same run, so the ratio survives a noisy, shared machine better than the raw rate.
//
// Input: the worker/app/gradient_stream.h stream with default options (Gaussian background,
// heavy log-normal coordinates, AR(1) rho=0.9 between steps), on which AdaComp sends about
// 1% of the elements at T=500 and about 4% at T=50. kSteps consecutive steps are generated
// up front and cycled; residues are warmed up before timing so the density is the steady one.
//
// Also measured: the library kernel per instruction set and store mode (adacomp_step_*: AVX-512
// / AVX2 with streaming "nt" or normal "st" stores, portable), the NaN/Inf scan alone (which
// Compress no longer runs: its double-buffered pass finds NaN/Inf itself), exact Top-k at 0.1%,
// the wire encodings (encode, DecodeAdd, bits per sent element), and the worker's push path
// (Compress + encode) with and without the NaN/Inf pre-scan it used to run. Only the
// project's own code is measured: the first prototype kernels and decoders are in the
// history (commit fcfe24d and before).
//
// After Google Benchmark's own output, a summary table with the codec's targets.
// Extra flags (mixed freely with --benchmark_* flags):
//   --elements=N    slice length (default 25000000)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/app/gradient_stream.h"
#include "bench/summary_reporter.h"
#include "benchmark/benchmark.h"
#include "common/compressor.h"
#include "common/wire_codec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace adaps {
namespace {

constexpr int kSteps = 4;
constexpr int kWarmupSteps = 4 * kSteps;  // a multiple of kSteps
constexpr uint32_t kBinSizes[] = {50, 500};
constexpr double kTopKFraction = 0.001;

size_t g_elements = 25'000'000;

// Everything the benchmarks share, built once, outside any timed region.
struct Data {
  size_t n = 0;
  std::vector<std::vector<float>> grads;  // kSteps consecutive steps of the stream
  // Per bin size: a steady-state residue and a representative update with its encodings.
  struct PerBin {
    std::vector<float> snapshot;  // residue after the warm-up steps
    CompressedUpdate update;
    std::vector<uint8_t> rice;
    std::vector<uint8_t> plain;
  };
  std::map<uint32_t, PerBin> per_bin;
  std::vector<float> topk_snapshot;  // Top-k residue after kSteps warm-up steps
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
      SliceState state(d->n);
      CompressorOptions o;
      o.bin_size = t;
      auto c = MakeCompressor(o);
      for (int s = 0; s < kWarmupSteps; ++s) {
        if (!c.ok() || !(*c)->Compress(d->grads[s % kSteps], state, pb.update).ok()) {
          std::fprintf(stderr, "warm-up compress failed\n");
          std::exit(1);
        }
      }
      pb.snapshot.assign(state.residue().begin(), state.residue().end());
      if (!EncodeUpdate(pb.update, IndexCoding::kRice, &pb.rice).ok() ||
          !EncodeUpdate(pb.update, IndexCoding::kPlain32, &pb.plain).ok()) {
        std::fprintf(stderr, "warm-up encode failed\n");
        std::exit(1);
      }
    }
    CompressorOptions o;
    o.kind = CompressorKind::kTopK;
    o.topk_fraction = kTopKFraction;
    auto c = MakeCompressor(o);
    SliceState state(d->n);
    CompressedUpdate u;
    for (int s = 0; s < kSteps; ++s) {
      if (!c.ok() || !(*c)->Compress(d->grads[s], state, u).ok()) std::exit(1);
    }
    d->topk_snapshot.assign(state.residue().begin(), state.residue().end());
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

// One compression step of some variant; false means it failed.
using StepFn = std::function<bool(const std::vector<float>& grad, SliceState& residue,
                                  CompressedUpdate& out)>;

// Times `step` over the kSteps stored gradients in turn, on a private copy of `snapshot`
// that is reset (untimed) every kSteps iterations: every variant sees exactly the same
// inputs, and one variant cannot disturb the residue another one starts from.
void RunSteps(benchmark::State& state, const std::vector<float>& snapshot, const StepFn& step,
              const std::function<void()>& on_reset = nullptr) {
  Data& d = GetData();
  SliceState residue(d.n);
  // Allocate (and fault in) the second residue buffer before timing, as a training run's
  // first step does once: the steady state is what is measured.
  residue.spare_residue();
  CompressedUpdate u;
  size_t k = 0;
  double sent = 0;
  for (auto _ : state) {
    if (k % kSteps == 0) {
      state.PauseTiming();
      std::copy(snapshot.begin(), snapshot.end(), residue.residue().begin());
      if (on_reset) on_reset();
      state.ResumeTiming();
    }
    if (!step(d.grads[k++ % kSteps], residue, u)) {
      state.SkipWithError("compression step failed");
      return;
    }
    sent += static_cast<double>(u.SentElements());
  }
  SetElementCounters(state, d.n);
  state.counters["density"] =
      sent / (static_cast<double>(state.iterations()) * static_cast<double>(d.n));
}

void BM_PlainPass(benchmark::State& state) {
  RunSteps(state, GetData().per_bin[500].snapshot,
           [](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
             PlainPass(g.data(), r.residue().data(), g.size());
             u.Clear();
             return true;
           });
}

// The NaN/Inf pre-scan of Compress on its own (reads 4 B per element).
void BM_AllFinite(benchmark::State& state) {
  Data& d = GetData();
  size_t k = 0;
  for (auto _ : state) {
    if (!AllFinite(d.grads[k++ % kSteps])) {
      state.SkipWithError("unexpected NaN");
      return;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(d.n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(d.n) *
                          4);
}

void BM_AdaCompCompress(benchmark::State& state, uint32_t t) {
  CompressorOptions o;
  o.bin_size = t;
  std::unique_ptr<Compressor> c = *MakeCompressor(o);
  RunSteps(state, GetData().per_bin[t].snapshot,
           [&](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
             return c->Compress(g, r, u).ok();
           });
}

// Compress with the library, but the 25M-element tensor cut into slices of `slice` elements
// (a multiple of T, as docs/algorithm.md allows: same bins, one scale per slice), each with
// its own SliceState.
void BM_AdaCompCompressSliced(benchmark::State& state, uint32_t t, size_t slice) {
  Data& d = GetData();
  const std::vector<float>& snapshot = d.per_bin[t].snapshot;
  CompressorOptions o;
  o.bin_size = t;
  std::unique_ptr<Compressor> c = *MakeCompressor(o);
  std::vector<SliceState> states;
  for (size_t lo = 0; lo < d.n; lo += slice) states.emplace_back(std::min(slice, d.n - lo));
  for (SliceState& st : states) st.spare_residue();  // allocated before timing, see RunSteps
  CompressedUpdate u;
  size_t k = 0;
  double sent = 0;
  for (auto _ : state) {
    if (k % kSteps == 0) {
      state.PauseTiming();
      for (size_t j = 0; j < states.size(); ++j) {
        std::copy_n(snapshot.begin() + static_cast<std::ptrdiff_t>(j * slice),
                    states[j].size(), states[j].residue().begin());
      }
      state.ResumeTiming();
    }
    const std::vector<float>& g = d.grads[k++ % kSteps];
    for (size_t j = 0; j < states.size(); ++j) {
      const absl::Span<const float> part(g.data() + j * slice, states[j].size());
      if (!c->Compress(part, states[j], u).ok()) {
        state.SkipWithError("compress failed");
        return;
      }
      sent += static_cast<double>(u.SentElements());
    }
  }
  SetElementCounters(state, d.n);
  state.counters["density"] =
      sent / (static_cast<double>(state.iterations()) * static_cast<double>(d.n));
}

// The library kernel alone (what Compress runs, without its length checks), for one ISA and
// store mode, double-buffered as SliceState is.
void BM_AdaCompStep(benchmark::State& state, uint32_t t, internal::AdaCompIsa isa,
                    internal::AdaCompStores stores) {
  if (!internal::AdaCompIsaSupported(isa)) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  std::vector<float> gmax;
  RunSteps(state, GetData().per_bin[t].snapshot,
           [&](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
             if (!internal::AdaCompStep(g, r.residue(), r.spare_residue(), t, gmax, u, isa,
                                        stores)) {
               return false;
             }
             r.swap_residue();
             return true;
           });
}

void BM_TopK(benchmark::State& state) {
  CompressorOptions o;
  o.kind = CompressorKind::kTopK;
  o.topk_fraction = kTopKFraction;
  std::unique_ptr<Compressor> c = *MakeCompressor(o);
  RunSteps(state, GetData().topk_snapshot,
           [&](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
             return c->Compress(g, r, u).ok();
           });
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

// A worker's replay of a forwarded SGD step (a sparse pull with servers running SGD): four
// workers' pushes (the representative update's indices rotated by a quarter of the slice
// each, so about four times its density in all), in place (TensorSpec::pull_in_place) or
// with the copy into the trainer's buffer.
void BM_ForwardedSgdReplay(benchmark::State& state, uint32_t t, bool in_place) {
  Data& d = GetData();
  const Data::PerBin& pb = d.per_bin[t];
  std::vector<std::vector<uint8_t>> pushes(4);
  std::vector<absl::Span<const uint8_t>> spans;
  for (size_t k = 0; k < pushes.size(); ++k) {
    CompressedUpdate u = pb.update;
    std::vector<std::pair<uint32_t, uint8_t>> moved;
    for (size_t j = 0; j < u.indices.size(); ++j) {
      moved.emplace_back(static_cast<uint32_t>((u.indices[j] + k * d.n / 4) % d.n),
                         u.negative[j]);
    }
    std::sort(moved.begin(), moved.end());
    for (size_t j = 0; j < moved.size(); ++j) {
      u.indices[j] = moved[j].first;
      u.negative[j] = moved[j].second;
    }
    if (!EncodeUpdate(u, IndexCoding::kRice, &pushes[k]).ok()) {
      state.SkipWithError("encode failed");
      return;
    }
    spans.push_back(pushes[k]);
  }
  std::vector<uint8_t> bytes;
  if (!EncodeForwardedSgd(0.25f, 1e-3f, spans, &bytes).ok()) {
    state.SkipWithError("forwarded encode failed");
    return;
  }
  std::vector<float> replica(d.n, 0.5f), out(d.n);
  for (auto _ : state) {
    const absl::Status s = DecodeForwardedSgdCopy(
        bytes, absl::MakeSpan(replica), in_place ? absl::MakeSpan(replica) : absl::MakeSpan(out));
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(d.n));
}

// The worker's push of one slice: Compress, then the wire encoding; `prescan` adds the
// AllFinite pass over the gradient that the worker once ran before every push.
void BM_Push(benchmark::State& state, uint32_t t, bool prescan) {
  CompressorOptions o;
  o.kind = CompressorKind::kAdaComp;
  o.bin_size = t;
  auto c = MakeCompressor(o);
  std::vector<uint8_t> bytes;
  RunSteps(state, GetData().per_bin[t].snapshot,
           [&](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
             if (prescan && !AllFinite(g)) return false;
             if (!(*c)->Compress(g, r, u).ok()) return false;
             bytes.clear();
             return EncodeUpdate(u, IndexCoding::kRice, &bytes).ok();
           });
}

const char* CodingName(IndexCoding c) { return c == IndexCoding::kRice ? "rice" : "plain32"; }

void RegisterAll() {
  benchmark::RegisterBenchmark("plain_pass", BM_PlainPass)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("nan_scan", BM_AllFinite)->Unit(benchmark::kMillisecond);
  for (uint32_t t : kBinSizes) {
    const std::string ts = absl::StrCat("/T:", t);
    benchmark::RegisterBenchmark(("adacomp_compress" + ts).c_str(), BM_AdaCompCompress, t)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("adacomp_compress_sliced250k" + ts).c_str(),
                                 BM_AdaCompCompressSliced, t, size_t{250'000})
        ->Unit(benchmark::kMillisecond);
    using internal::AdaCompIsa;
    using internal::AdaCompStores;
    for (const auto& [name, isa, stores] :
         {std::tuple{"avx512_nt", AdaCompIsa::kAvx512, AdaCompStores::kStreaming},
          std::tuple{"avx512_st", AdaCompIsa::kAvx512, AdaCompStores::kRegular},
          std::tuple{"avx2_nt", AdaCompIsa::kAvx2, AdaCompStores::kStreaming},
          std::tuple{"avx2_st", AdaCompIsa::kAvx2, AdaCompStores::kRegular},
          std::tuple{"portable", AdaCompIsa::kPortable, AdaCompStores::kRegular}}) {
      benchmark::RegisterBenchmark(absl::StrCat("adacomp_step_", name, ts).c_str(),
                                   BM_AdaCompStep, t, isa, stores)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (uint32_t t : kBinSizes) {
    const std::string ts = absl::StrCat("/T:", t);
    benchmark::RegisterBenchmark(("push" + ts).c_str(), BM_Push, t, false)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("push_prescan" + ts).c_str(), BM_Push, t, true)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("topk/0.1%", BM_TopK)->Unit(benchmark::kMillisecond);
  for (bool in_place : {false, true}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("forwarded_sgd_replay_4_pushes", in_place ? "_in_place" : "_copy", "/T:500")
            .c_str(),
        BM_ForwardedSgdReplay, 500u, in_place)
        ->Unit(benchmark::kMillisecond);
  }
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
  std::printf("AdaComp kernel: %s. Stream: worker/app/gradient_stream.h defaults, seed 42.\n",
              internal::AdaCompIsaName(internal::AdaCompIsa::kAuto));
  std::printf("%-38s %8s %9s %9s %9s\n", "compress (one step)", "G el/s", "vs plain",
              "vs top-k", "density");
  auto row = [&](const std::string& label, const std::string& name) {
    const double v = rep.Get(name, "items_per_second");
    if (std::isnan(v)) return;
    double density = rep.Get(name, "density");
    if (name.rfind("topk", 0) == 0) density = kTopKFraction;
    const std::string dens =
        std::isnan(density) || density == 0.0 ? "-" : absl::StrFormat("%.3f%%", 100.0 * density);
    std::printf("%-38s %8.3f %9.2f %9.1f %9s\n", label.c_str(), v / 1e9, v / plain, v / topk,
                dens.c_str());
  };
  row("plain pass r+=g (12 B/el)", "plain_pass");
  row("NaN/Inf scan alone (4 B/el)", "nan_scan");
  row("top-k 0.1% (exact, nth_element)", "topk/0.1%");
  for (uint32_t t : kBinSizes) {
    const std::string ts = absl::StrCat("/T:", t);
    row("adacomp Compress" + ts, "adacomp_compress" + ts);
    row("adacomp Compress, 250k slices" + ts, "adacomp_compress_sliced250k" + ts);
    for (const char* k : {"avx512_nt", "avx512_st", "avx2_nt", "avx2_st", "portable"}) {
      row(absl::StrCat("adacomp step ", k, ts), absl::StrCat("adacomp_step_", k, ts));
    }
    row("push: Compress + encode" + ts, "push" + ts);
    row("push with the old NaN pre-scan" + ts, "push_prescan" + ts);
  }

  std::printf("\n%-28s %12s %13s %8s %9s\n", "wire codec", "M sent el/s", "G dense el/s",
              "bits/el", "density");
  for (uint32_t t : kBinSizes) {
    for (const char* op : {"encode", "decode_add"}) {
      for (IndexCoding c : {IndexCoding::kRice, IndexCoding::kPlain32}) {
        const std::string name = absl::StrCat(op, "_", CodingName(c), "/T:", t);
        const double v = rep.Get(name, "items_per_second");
        if (std::isnan(v)) continue;
        std::printf("%-28s %12.1f %13.2f %8.2f %8.3f%%\n", name.c_str(), v / 1e6,
                    rep.Get(name, "dense_el/s") / 1e9, rep.Get(name, "bits/el"),
                    100.0 * rep.Get(name, "density"));
      }
    }
  }

  std::printf("\ntargets (one core):\n");
  auto target = [](const std::string& what, double got, double want, const char* unit) {
    if (std::isnan(got)) return;
    std::printf("  %-40s %7.2f %-7s (target >= %.1f) %s\n", what.c_str(), got, unit, want,
                got >= want ? "MET" : "MISSED");
  };
  for (uint32_t t : kBinSizes) {
    const double want = t == 50 ? 0.6 : 1.0;
    const std::string ts = absl::StrCat(" T=", t);
    const double full = rep.Get(absl::StrCat("adacomp_compress/T:", t), "items_per_second");
    target("AdaComp Compress" + ts, full / 1e9, want, "G el/s");
    target("AdaComp Compress / top-k" + ts, full / topk, 8.0, "x");
  }
  const double bits = rep.Get("encode_rice/T:500", "bits/el");
  if (!std::isnan(bits)) {
    std::printf("  %-40s %7.2f %-7s (target <= 12 at %.2f%% density) %s\n",
                "rice bits per sent element, ~1% stream", bits, "bits",
                100.0 * rep.Get("encode_rice/T:500", "density"), bits <= 12.0 ? "MET" : "MISSED");
  }
}

}  // namespace
}  // namespace adaps

int main(int argc, char** argv) {
  return adaps::BenchmarkMain(argc, argv, &adaps::g_elements, 1000, adaps::RegisterAll,
                              adaps::PrintSummary);
}
