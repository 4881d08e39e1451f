// adaps-engine-bench: the server's work on one step, in process (no sockets), against the
// memory-bandwidth limit.
//
// Per received element: dense add (a dense push decoded into the aggregation buffer) and
// sparse decode-add (a Rice-coded AdaComp push, per *sent* element). Per parameter: each
// optimizer, and recompression (Shard::AnswerPull of a recompressed pull after a step: the
// fused AdaComp pass over params - published, encode, apply to the published replica). The
// per-parameter figures are also given as a ratio to a plain pass (r[i] += g[i]) measured in
// the same run. Then the engine (server/engine.h) with 1 and 2 engine threads on 8 slices:
// one step = a sparse push to every slice, the SGD step and a recompressed pull of every
// slice, waited for; wall time, so the ratio shows what a second thread adds. Beside it the
// same with the two engines' steps interleaved one by one (engine_8_slices/paired), and a
// plain pass on 1 and 2 threads: what two cores add to streaming memory alone.
//
// Inputs: the worker/app/gradient_stream.h stream (AdaComp sends about 1% at T=500), as in
// adaps-codec-bench. After Google Benchmark's own output, a summary with the engine's targets.
// Extra flags (mixed freely with --benchmark_* flags):
//   --elements=N    parameters in all (default 8000000; the engine cuts them in 8 slices)
//   --warm          do not evict the caches before each iteration of the per-parameter
//                   benchmarks (plain pass, optimizers, recompression): the figures of the
//                   rounds before 2026-12-01 19:00, whose plain pass at 8M elements (64 MB)
//                   was served partly from the 32 MB L3
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/app/gradient_stream.h"
#include "bench/summary_reporter.h"
#include "benchmark/benchmark.h"
#include "common/compressor.h"
#include "common/optimizer.h"
#include "common/wire_codec.h"
#include "server/engine.h"
#include "server/shard.h"

namespace adaps {
namespace {

constexpr int kSteps = 4;
constexpr int kSlices = 8;
constexpr uint32_t kBinSize = 500;
size_t g_elements = 8'000'000;

struct Data {
  size_t n = 0;
  std::vector<std::vector<float>> grads;  // kSteps consecutive steps of the stream
  SharedBytes dense;                      // a dense push of grads[0]
  std::map<uint32_t, CompressedUpdate> update;  // steady-state AdaComp update per bin size
  std::map<uint32_t, SharedBytes> rice;
  std::vector<SharedBytes> slice_pushes;  // per engine slice: a steady Rice push
};

SharedBytes Encode(const CompressedUpdate& u) {
  auto bytes = std::make_shared<Bytes>();
  if (!EncodeUpdate(u, IndexCoding::kRice, bytes.get()).ok()) std::exit(1);
  return bytes;
}

// A steady-state AdaComp update of `g` (after warm-up steps over the stream).
CompressedUpdate Steady(const std::vector<std::vector<float>>& grads, size_t lo, size_t len,
                        uint32_t t) {
  CompressorOptions o;
  o.bin_size = t;
  auto c = MakeCompressor(o);
  SliceState state(len);
  CompressedUpdate u;
  for (int s = 0; s < 4 * kSteps; ++s) {
    const auto g = absl::MakeConstSpan(grads[s % kSteps]).subspan(lo, len);
    if (!c.ok() || !(*c)->Compress(g, state, u).ok()) std::exit(1);
  }
  return u;
}

Data& GetData() {
  static Data* data = [] {
    auto* d = new Data;
    d->n = g_elements;
    bench::GradientStream stream(bench::GradientStream::Tuned1Percent(d->n, 42));
    d->grads.assign(kSteps, std::vector<float>(d->n));
    for (auto& g : d->grads) stream.Next(absl::MakeSpan(g));
    CompressedUpdate dense;
    dense.kind = CompressorKind::kDense;
    dense.length = static_cast<uint32_t>(d->n);
    dense.values = d->grads[0];
    d->dense = Encode(dense);
    for (uint32_t t : {50u, 500u}) {
      d->update[t] = Steady(d->grads, 0, d->n, t);
      d->rice[t] = Encode(d->update[t]);
    }
    const size_t per = d->n / kSlices;
    for (int s = 0; s < kSlices; ++s) {
      d->slice_pushes.push_back(Encode(Steady(d->grads, s * per, per, kBinSize)));
    }
    return d;
  }();
  return *data;
}

void PerElement(benchmark::State& state, size_t n) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}

// Reads a buffer three times the L3 of the machine (32 MB here) so that the next pass starts
// with none of its arrays cached: the server's arrays of a real model are far larger than
// the caches, and a reference pass served partly from L3 (the plain pass's 64 MB at the
// default 8M elements against recompression's 128 MB) would flatter the reference. Read
// only: its lines are clean and leave without a write-back during the timed pass. Runs with
// the timer paused.
void EvictCaches() {
  static std::vector<uint64_t>* buffer = [] {
    auto* b = new std::vector<uint64_t>((96u << 20) / sizeof(uint64_t));
    for (size_t i = 0; i < b->size(); ++i) (*b)[i] = i;  // real pages, not the zero page
    return b;
  }();
  uint64_t sum = 0;
  for (size_t i = 0; i < buffer->size(); i += 8) sum += (*buffer)[i];
  benchmark::DoNotOptimize(sum);
}

// The per-parameter benchmarks start each iteration with cold caches (EvictCaches) unless
// --warm is given (the figures of earlier rounds).
bool g_warm = false;
void Cold(benchmark::State& state) {
  if (g_warm) return;
  state.PauseTiming();
  EvictCaches();
  state.ResumeTiming();
}

__attribute__((noinline)) void PlainPass(const float* g, float* r, size_t n) {
  for (size_t i = 0; i < n; ++i) r[i] += g[i];
}

void BM_PlainPass(benchmark::State& state) {
  const Data& d = GetData();
  std::vector<float> r(d.n, 0.0f);
  for (auto _ : state) {
    Cold(state);
    PlainPass(d.grads[0].data(), r.data(), d.n);
    benchmark::DoNotOptimize(r.data());
    benchmark::ClobberMemory();
  }
  PerElement(state, d.n);
}

// The plain pass split over `threads` threads (each its own contiguous part), from cold
// caches: what a second core adds to purely memory-bound work on this machine. The engine's
// step is mostly such passes (its bin maxima and selection are compute, which scales), so its
// 2-thread ratio stays near this one. Both counts start their threads in the timed part,
// the same tens of microseconds against passes of milliseconds.
void BM_PlainPassThreads(benchmark::State& state, int threads) {
  const Data& d = GetData();
  std::vector<float> r(d.n, 0.0f);
  const size_t per = d.n / threads;
  for (auto _ : state) {
    Cold(state);
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k) {
      const size_t lo = k * per, len = k + 1 == threads ? d.n - lo : per;
      pool.emplace_back([&, lo, len] { PlainPass(d.grads[0].data() + lo, r.data() + lo, len); });
    }
    for (std::thread& t : pool) t.join();
    benchmark::DoNotOptimize(r.data());
    benchmark::ClobberMemory();
  }
  PerElement(state, d.n);
}

// The memory floor of recompression's access pattern: per element three loads (params,
// published, the residue) and one store (the new residue), out = in + (p - pub - in), with
// no bin maximum, selection, fix-up or encoding. Recompression can at best run at this
// speed; its ratio to a plain pass can at best be this one's.
__attribute__((noinline)) void ThreeReadsOneWrite(const float* __restrict p,
                                                  const float* __restrict pub,
                                                  const float* __restrict in,
                                                  float* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = in[i] + (p[i] - pub[i] - in[i]);
}

void BM_RecompressFloor(benchmark::State& state) {
  const Data& d = GetData();
  std::vector<float> out(d.n, 0.0f), in(d.n, 0.0f);
  for (auto _ : state) {
    Cold(state);
    ThreeReadsOneWrite(d.grads[0].data(), d.grads[1].data(), in.data(), out.data(), d.n);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  PerElement(state, d.n);
}

void BM_DenseAdd(benchmark::State& state) {
  const Data& d = GetData();
  std::vector<float> agg(d.n, 0.0f);
  for (auto _ : state) {
    if (!DecodeAdd(*d.dense, 1.0f, absl::MakeSpan(agg)).ok()) state.SkipWithError("decode");
    benchmark::ClobberMemory();
  }
  PerElement(state, d.n);
}

void BM_SparseDecodeAdd(benchmark::State& state, uint32_t t) {
  const Data& d = GetData();
  std::vector<float> agg(d.n, 0.0f);
  for (auto _ : state) {
    if (!DecodeAdd(*d.rice.at(t), 1.0f, absl::MakeSpan(agg)).ok()) state.SkipWithError("decode");
    benchmark::ClobberMemory();
  }
  PerElement(state, d.update.at(t).indices.size());  // per sent element
}

void BM_Optimizer(benchmark::State& state, OptimizerKind kind) {
  const Data& d = GetData();
  OptimizerConfig config;
  config.kind = kind;
  std::vector<float> params(d.n, 0.0f);
  OptimizerState os;
  ApplyOptimizer(config, d.grads[0], absl::MakeSpan(params), os);  // sizes m, v
  for (auto _ : state) {
    Cold(state);
    ApplyOptimizer(config, d.grads[1], absl::MakeSpan(params), os);
    benchmark::ClobberMemory();
  }
  PerElement(state, d.n);
}

// Shard::AnswerPull (recompressed) after each SGD step; the step itself is not timed.
void BM_Recompress(benchmark::State& state) {
  const Data& d = GetData();
  auto shard = Shard::Create(1, "bench", static_cast<uint32_t>(d.n), kBinSize);
  if (!shard.ok()) return state.SkipWithError("create");
  OptimizerConfig sgd;
  auto push = ParseUpdate(*d.dense);  // as Server::OnPush parses it
  if (!push.ok()) return state.SkipWithError("parse");
  for (int s = 0; s < kSteps; ++s) {  // warm the downlink residue up
    if (!shard->ApplyPush(*push, sgd).ok()) return state.SkipWithError("push");
    if (!shard->AnswerPull({"r", 1, 0, shard->version() - 1, Shard::Format::kRecompressed})
             .ok()) {
      return state.SkipWithError("pull");
    }
  }
  for (auto _ : state) {
    state.PauseTiming();
    if (!shard->ApplyPush(*push, sgd).ok()) return state.SkipWithError("push");
    if (!g_warm) EvictCaches();
    state.ResumeTiming();
    auto a = shard->AnswerPull({"r", 1, 0, shard->version() - 1, Shard::Format::kRecompressed});
    if (!a.ok() || !a->payload) return state.SkipWithError("pull");
  }
  PerElement(state, d.n);
}

// The recompression as the server did it before the fused pass (commit ac34a5b): the change
// stored, Compress, Rice encode, decode of the bytes into the published replica. For the
// ratio fused / unfused in the same run.
void BM_RecompressUnfused(benchmark::State& state) {
  const Data& d = GetData();
  CompressorOptions o;
  o.bin_size = kBinSize;
  o.non_finite = NonFinitePolicy::kSendNothing;
  auto c = MakeCompressor(o);
  if (!c.ok()) return state.SkipWithError("compressor");
  std::vector<float> params(d.n, 0.0f), published(d.n, 0.0f), change(d.n);
  SliceState residue(d.n);
  CompressedUpdate u;
  std::vector<uint8_t> bytes;
  int step = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const std::vector<float>& g = d.grads[step++ % kSteps];
    for (size_t i = 0; i < d.n; ++i) params[i] -= 0.01f * g[i];
    if (!g_warm) EvictCaches();
    state.ResumeTiming();
    const float* r = residue.residue().data();
    for (size_t i = 0; i < d.n; ++i) change[i] = params[i] - published[i] - r[i];
    if (!(*c)->Compress(change, residue, u).ok()) return state.SkipWithError("compress");
    bytes.clear();
    if (!EncodeUpdate(u, IndexCoding::kRice, &bytes).ok()) return state.SkipWithError("encode");
    if (!DecodeAdd(bytes, 1.0f, absl::MakeSpan(published)).ok()) return state.SkipWithError("add");
  }
  PerElement(state, d.n);
}

// Counts pull answers; the engine threads call it.
class CountingSink final : public EngineSink {
 public:
  void Send(const std::string&, int, OutMessage m) override {
    const msg::Envelope* env = msg::GetEnvelope(m.header.data());
    if (env->body_type() == msg::Body::Error) errors_.fetch_add(1);
    if (env->body_type() != msg::Body::PullResponse) return;
    absl::MutexLock lock(&mu_);
    ++answers_;
  }
  Sender self() const override { return Sender{msg::Role::Server, 0}; }
  void WaitFor(uint64_t answers) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return answers_ >= answers; };
    mu_.Await(absl::Condition(&done));
  }
  uint64_t errors() const { return errors_.load(); }

 private:
  absl::Mutex mu_;
  uint64_t answers_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> errors_{0};
};

// An engine with `threads` engine threads over the 8 slices, declared; Step() runs one
// step (a push to and a recompressed pull of every slice) and waits for the answers.
class EngineRig {
 public:
  explicit EngineRig(int threads) : engine_(MakeOptions(threads), &sink_) {
    const Data& d = GetData();
    const uint32_t per = static_cast<uint32_t>(d.n / kSlices);
    engine_.Start();
    for (uint64_t key = 0; key < kSlices; ++key) {
      DeclareWork w;
      w.key = key;
      w.length = per;
      w.bin_size = kBinSize;
      engine_.Submit(engine_.AssignOwner(key), std::move(w));
    }
    engine_.SetLiveWorkers({0});
  }
  ~EngineRig() { engine_.Stop(); }
  EngineRig(const EngineRig&) = delete;
  EngineRig& operator=(const EngineRig&) = delete;

  void Step() {
    const Data& d = GetData();
    for (uint64_t key = 0; key < kSlices; ++key) {
      PushWork push;
      push.key = key;
      push.worker = 0;
      push.step = step_;
      push.bytes = d.slice_pushes[key];
      push.push = *ParseUpdate(*push.bytes);  // as Server::OnPush parses it
      engine_.Submit(engine_.OwnerOf(key), std::move(push));
      PullWork pull;
      pull.key = key;
      pull.request_id = 1;
      pull.min_version = step_ + 1;
      pull.have_version = step_;
      pull.format = Shard::Format::kRecompressed;
      engine_.Submit(engine_.OwnerOf(key), std::move(pull));
    }
    ++step_;
    answers_ += kSlices;
    sink_.WaitFor(answers_);
  }
  uint64_t errors() const { return sink_.errors(); }

 private:
  static EngineOptions MakeOptions(int threads) {
    EngineOptions o;
    o.threads = threads;
    return o;
  }
  CountingSink sink_;
  Engine engine_;
  uint64_t step_ = 0, answers_ = 0;
};

void BM_Engine(benchmark::State& state, int threads) {
  const Data& d = GetData();
  EngineRig rig(threads);
  for (auto _ : state) rig.Step();
  if (rig.errors() != 0) state.SkipWithError("engine answered with errors");
  PerElement(state, d.n);
}

// 1 and 2 engine threads, one step of each in turn (the order alternating), each pair timed
// on its own: the ratio of the medians of the two sides. Pairs ~40 ms apart see the same
// memory bandwidth, which on this VM moves by up to 2x from minute to minute (the separate
// benchmarks above run seconds apart). Reported as the counter `speedup`.
void BM_EnginePaired(benchmark::State& state) {
  EngineRig one(1), two(2);
  std::vector<double> t1, t2;
  bool flip = false;
  for (auto _ : state) {
    for (int k = 0; k < 2; ++k) {
      const bool first_one = (k == 0) != flip;
      const auto started = std::chrono::steady_clock::now();
      (first_one ? one : two).Step();
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      (first_one ? t1 : t2).push_back(sec);
    }
    flip = !flip;
  }
  if (one.errors() != 0 || two.errors() != 0) state.SkipWithError("engine errors");
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  state.counters["speedup"] = median(t1) / median(t2);
  state.counters["pairs"] = static_cast<double>(t1.size());
}

const std::vector<std::pair<const char*, OptimizerKind>>& Optimizers() {
  static const auto* list = new std::vector<std::pair<const char*, OptimizerKind>>{
      {"sum", OptimizerKind::kSumOnly},   {"mean", OptimizerKind::kMean},
      {"sgd", OptimizerKind::kSgd},       {"momentum", OptimizerKind::kMomentum},
      {"nesterov", OptimizerKind::kNesterov}, {"adam", OptimizerKind::kAdam}};
  return *list;
}

void RegisterAll() {
  benchmark::RegisterBenchmark("plain_pass", BM_PlainPass)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("dense_add", BM_DenseAdd)->Unit(benchmark::kMillisecond);
  for (uint32_t t : {50u, 500u}) {
    benchmark::RegisterBenchmark(absl::StrCat("sparse_decode_add/T:", t).c_str(),
                                 BM_SparseDecodeAdd, t)
        ->Unit(benchmark::kMicrosecond);
  }
  for (const auto& [name, kind] : Optimizers()) {
    benchmark::RegisterBenchmark(absl::StrCat("optimizer/", name).c_str(), BM_Optimizer, kind)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("recompress_floor", BM_RecompressFloor)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("recompress/T:500", BM_Recompress)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("recompress_unfused/T:500", BM_RecompressUnfused)
      ->Unit(benchmark::kMillisecond);
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(absl::StrCat("engine_8_slices/threads:", threads).c_str(),
                                 BM_Engine, threads)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(absl::StrCat("plain_pass_threads/threads:", threads).c_str(),
                                 BM_PlainPassThreads, threads)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("engine_8_slices/paired", BM_EnginePaired)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(2.0);
}

void Line(const char* what, double value, const char* unit, const char* target, bool met) {
  std::printf("  %-44s %10.2f %-10s %-22s %s\n", what, value, unit, target,
              std::isnan(value) ? "(not run)" : met ? "met" : "NOT met");
}

void PrintSummary(const SummaryReporter& rep) {
  // A line whose figures were not run (--benchmark_filter) is left out.
  auto have = [](std::initializer_list<double> vs) {
    for (double v : vs) {
      if (std::isnan(v)) return false;
    }
    return true;
  };
  const double plain = rep.Get("plain_pass");
  std::printf("\n== Summary: %zu parameters, %d engine slices, median over repetitions, %s ==\n",
              g_elements, kSlices,
              g_warm ? "warm caches (--warm)" : "each per-parameter pass from cold caches");
  if (have({plain})) {
    std::printf("  plain pass r += g: %.1f M elements/s (the reference of the ratios)\n",
                plain / 1e6);
  }
  const double dense = rep.Get("dense_add");
  if (have({dense})) std::printf("  dense add: %.1f M received elements/s\n", dense / 1e6);
  const double sparse = rep.Get("sparse_decode_add/T:500");
  const double sparse50 = rep.Get("sparse_decode_add/T:50");
  if (have({sparse50})) std::printf("  sparse decode-add T=50: %.1f M sent elements/s\n", sparse50 / 1e6);
  for (const auto& [name, kind] : Optimizers()) {
    const double v = rep.Get(absl::StrCat("optimizer/", name));
    if (have({v, plain})) {
      std::printf("  optimizer %-9s %8.1f M params/s  %.2fx plain\n", name, v / 1e6, v / plain);
    }
  }
  const double recompress = rep.Get("recompress/T:500");
  const double unfused = rep.Get("recompress_unfused/T:500");
  if (have({recompress, unfused, plain})) {
    std::printf("  recompression: fused %.1f M params/s (%.2fx plain), the unfused path of "
                "before %.1f M (%.2fx plain): %.2fx faster\n",
                recompress / 1e6, recompress / plain, unfused / 1e6, unfused / plain,
                recompress / unfused);
  }
  const double floor = rep.Get("recompress_floor");
  if (have({floor, recompress, plain})) {
    std::printf("  recompression's memory floor (3 loads + 1 store an element): %.1f M "
                "params/s (%.2fx plain); recompression runs at %.2fx its floor\n",
                floor / 1e6, floor / plain, recompress / floor);
  }
  const double one = rep.Get("engine_8_slices/threads:1/real_time");
  const double two = rep.Get("engine_8_slices/threads:2/real_time");
  if (have({one, two})) {
    std::printf("  engine 1 thread: %.1f M params/s per step; 2 threads: %.1f M\n", one / 1e6,
                two / 1e6);
  }
  const double paired = rep.Get("engine_8_slices/paired/min_time:2.000/real_time", "speedup");
  std::printf("\n  targets                                      measured   unit       target\n");
  Line("2 engine threads vs 1 on 8 slices", two / one, "x", ">= 1.7x", two / one >= 1.7);
  Line("  the same, steps paired (engine_*/paired)", paired, "x", ">= 1.7x", paired >= 1.7);
  const double mem = rep.Get("plain_pass_threads/threads:2/real_time") /
                     rep.Get("plain_pass_threads/threads:1/real_time");
  if (have({mem})) {
    std::printf("  %-44s %10.2f x          (streaming memory alone: what 2 cores get)\n",
                "  plain pass on 2 threads vs 1", mem);
  }
  Line("sparse decode-add T=500 (one thread)", sparse / 1e6, "M sent/s", ">= 60 M/s",
       sparse >= 60e6);
  Line("recompression vs plain pass", recompress / plain, "x", ">= 0.6x",
       recompress / plain >= 0.6);
}

}  // namespace
}  // namespace adaps

int main(int argc, char** argv) {
  int kept = 0;  // --warm is ours: take it out before Google Benchmark sees the flags
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--warm") == 0) {
      adaps::g_warm = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return adaps::BenchmarkMain(argc, argv, &adaps::g_elements, 8000, adaps::RegisterAll,
                              adaps::PrintSummary);
}
