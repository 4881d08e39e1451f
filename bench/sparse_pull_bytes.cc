// Bytes and engine time of a pull answer per format, on one server shard fed by W workers'
// AdaComp pushes of a realistic gradient stream (worker/app/gradient_stream.h, tuned to ~1% at
// T=500): the sparse answer of an SGD server and of a mean server (what local mode gets): the
// step's pushes forwarded, the puller's own left out (server/shard.h; the merged index list
// with the new values is larger for AdaComp's pushes),
// recompressed and dense; and the engine's time per step (decode-adds, optimizer, encoding)
// with each. docs/benchmarks.md and schemas/README.md "Sparse pulls".
//
//   adaps-sparse-pull-bytes [length] [steps] [workers...]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/app/gradient_stream.h"
#include "common/compressor.h"
#include "common/wire_codec.h"
#include "server/shard.h"

namespace adaps {
namespace {

struct Figures {
  double bytes = 0, ms = 0;
  double answers_as_asked = 0;  // forwarded (sparse pulls), recompressed: not dense
};

// One run of `steps` steps (after 3 warm-up steps) of `workers` workers; `format` is the
// pull the shard answers (its engine time is what is measured), to worker 0 holding its
// push; `mean`: a mean server (local mode), else SGD.
Figures Run(uint32_t length, int steps, int workers, Shard::Format format, bool mean) {
  OptimizerConfig sgd;
  sgd.kind = mean ? OptimizerKind::kMean : OptimizerKind::kSgd;
  sgd.learning_rate = 0.01f;
  sgd.weight_decay = 0.0f;
  Shard shard = *Shard::Create(1, "t", length, 500);
  std::vector<std::unique_ptr<bench::GradientStream>> streams;
  std::vector<SliceState> residues;
  CompressorOptions o;
  o.kind = CompressorKind::kAdaComp;
  o.bin_size = 500;
  std::unique_ptr<Compressor> compressor = *MakeCompressor(o);
  std::set<int> live;
  for (int w = 0; w < workers; ++w) {
    streams.push_back(std::make_unique<bench::GradientStream>(
        bench::GradientStream::Tuned1Percent(length, 100 + w)));
    residues.emplace_back(length);
    live.insert(w);
  }
  Shard::Pull pull{"r", 1, 0, 0, format};
  pull.worker = 0;
  (void)shard.AnswerPull(pull);  // a sparse pull starts the tracking
  std::vector<float> grad(length);
  Figures f;
  const int warmup = 3;
  for (int step = 0; step < warmup + steps; ++step) {
    std::vector<std::vector<uint8_t>> pushes(workers);
    for (int w = 0; w < workers; ++w) {
      streams[w]->Next(absl::MakeSpan(grad));
      CompressedUpdate u;
      if (!compressor->Compress(grad, residues[w], u).ok()) std::abort();
      if (!EncodeUpdate(u, IndexCoding::kRice, &pushes[w]).ok()) std::abort();
    }
    const absl::Time start = absl::Now();
    for (int w = 0; w < workers; ++w) {
      // As the engine: SGD (no weight decay) steps a tracked step push by push.
      // (Parsed as the server parses a push: Server::OnPush.)
      auto push = ParseUpdate(pushes[w]);
      if (!push.ok()) std::abort();
      if (!shard.AddPush(w, step, *push, 0, /*step_each_push=*/!mean).ok()) std::abort();
    }
    if (!shard.CompleteStepIfReady(live, sgd)) std::abort();
    pull.have_version = shard.version() - 1;
    pull.held_push = shard.version();
    auto answer = shard.AnswerPull(pull);
    if (!answer.ok()) std::abort();
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (step < warmup) continue;
    f.bytes += (answer->payload ? static_cast<double>(answer->payload->size()) : 0.0) / steps;
    f.ms += ms / steps;
    // Sparse pulls of AdaComp pushes: a mean step's and an SGD step's pushes forwarded.
    const Shard::Format expect =
        format != Shard::Format::kSparse ? format : Shard::Format::kForwarded;
    f.answers_as_asked += answer->format == expect ? 1 : 0;
  }
  return f;
}

}  // namespace
}  // namespace adaps

int main(int argc, char** argv) {
  const uint32_t length = argc > 1 ? static_cast<uint32_t>(std::atol(argv[1])) : 1000000;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 10;
  std::vector<int> workers;
  for (int i = 3; i < argc; ++i) workers.push_back(std::atoi(argv[i]));
  if (workers.empty()) workers = {1, 2, 4, 8, 16};
  std::printf("%u floats, %d steps, AdaComp T=500; bytes per pull answer to one worker and "
              "engine ms per step (decode-adds + optimizer + answer)\n",
              length, steps);
  std::printf("| workers | SGD server: sparse, forwarded, own left out B | mean server: forwarded, "
              "own left out B | recompressed (SGD, lossy) B | dense B | engine ms SGD sparse | "
              "engine ms mean forwarded | engine ms recompressed |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  using adaps::Shard;
  for (int w : workers) {
    const adaps::Figures s = adaps::Run(length, steps, w, Shard::Format::kSparse, false);
    const adaps::Figures m = adaps::Run(length, steps, w, Shard::Format::kSparse, true);
    const adaps::Figures r = adaps::Run(length, steps, w, Shard::Format::kRecompressed, false);
    // (An answer that was not of the expected format, e.g. dense: the counts say.)
    std::printf("| %d | %.0f (%.0f/%d forwarded) | %.0f (%.0f/%d forwarded) | %.0f | %u | %.2f | "
                "%.2f | %.2f |\n",
                w, s.bytes, s.answers_as_asked, steps, m.bytes, m.answers_as_asked, steps,
                r.bytes, length * 4, s.ms, m.ms, r.ms);
    std::fflush(stdout);
  }
  return 0;
}
