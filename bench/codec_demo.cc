// adaps-codec-demo: the codec on a realistic gradient stream, layer by layer.
//
// Each layer of a small CNN-plus-MLP model gets its own gradient stream (bench/
// gradient_stream.h) and its own AdaComp residue (T=50 for conv layers, T=500 for
// fully-connected ones, as in the AdaComp paper). Every step is compressed, encoded with the
// compact Rice coding (what a worker would push), decoded back into a running sum with
// DecodeAdd (what a server would do), and the error-feedback invariant
//   sum of gradients == sum of decoded updates + residue
// is checked on the fly. Prints per layer the density, bits per sent element, compression
// rate (dense bytes / encoded bytes, headers counted), and the total saving.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/app/gradient_stream.h"
#include "common/compressor.h"
#include "common/wire_codec.h"

ABSL_FLAG(int, steps, 100, "training steps to simulate");
ABSL_FLAG(uint64_t, seed, 1, "seed of the gradient streams (same seed, same output)");
ABSL_FLAG(double, tolerance, 1e-4,
          "error-feedback check: max |sum g - sum decoded - residue| allowed, relative to "
          "max |sum g| of the layer");

namespace adaps {
namespace {

struct Layer {
  std::string name;
  std::string shape;
  size_t length;
  uint32_t bin_size;
};

struct LayerStats {
  uint64_t sent = 0;
  uint64_t rice_bytes = 0;
  uint64_t plain_bytes = 0;
  double max_error = 0.0;  // relative, worst step
};

int Run() {
  const int steps = absl::GetFlag(FLAGS_steps);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const double tolerance = absl::GetFlag(FLAGS_tolerance);
  if (steps < 1) {
    std::fprintf(stderr, "--steps must be at least 1\n");
    return 2;
  }

  const std::vector<Layer> layers = {
      {"conv1", "5x5x1x32", 5 * 5 * 1 * 32, 50},
      {"conv2", "5x5x32x64", 5 * 5 * 32 * 64, 50},
      {"conv3", "3x3x64x128", 3 * 3 * 64 * 128, 50},
      {"fc1", "3136x512", 3136 * 512, 500},
      {"fc2", "1024x256", 1024 * 256, 500},
      {"fc3", "256x10", 256 * 10, 500},
  };

  std::printf("adaps-codec-demo: AdaComp on a synthetic gradient stream, %d steps, seed %llu\n",
              steps, static_cast<unsigned long long>(seed));
  std::printf("stream: Gaussian background, %.1f%% heavy coordinates (x%.0f), log-normal "
              "scales, AR(1) rho=%.2f between steps, per-coordinate drift (worker/app/gradient_stream.h)\n\n",
              100.0 * bench::GradientStreamOptions().heavy_fraction,
              bench::GradientStreamOptions().heavy_multiplier, bench::GradientStreamOptions().rho);

  std::printf("%-6s %-11s %9s %4s %8s %10s %10s %11s %9s\n", "layer", "shape", "elements", "T",
              "density", "bits/el", "bits/el", "compression", "EF check");
  std::printf("%-6s %-11s %9s %4s %8s %10s %10s %11s %9s\n", "", "", "", "", "", "(rice)",
              "(plain32)", "(rice)", "max err");

  uint64_t total_dense = 0, total_rice = 0, total_plain = 0;
  bool ok = true;
  for (size_t l = 0; l < layers.size(); ++l) {
    const Layer& layer = layers[l];
    const size_t n = layer.length;
    bench::GradientStreamOptions so;
    so.length = n;
    so.seed = seed * 1000003ull + l;
    bench::GradientStream stream(so);

    CompressorOptions co;
    co.kind = CompressorKind::kAdaComp;
    co.bin_size = layer.bin_size;
    auto compressor_or = MakeCompressor(co);
    if (!compressor_or.ok()) {
      std::fprintf(stderr, "%s\n", compressor_or.status().ToString().c_str());
      return 1;
    }
    Compressor& compressor = **compressor_or;
    SliceState state(n);
    CompressedUpdate update;
    std::vector<uint8_t> rice, plain;
    std::vector<float> grad(n), decoded(n);
    std::vector<double> sum_grad(n, 0.0), sum_decoded(n, 0.0);
    LayerStats st;

    for (int t = 0; t < steps; ++t) {
      stream.Next(absl::MakeSpan(grad));
      absl::Status s = compressor.Compress(grad, state, update);
      if (s.ok()) s = EncodeUpdate(update, IndexCoding::kRice, &rice);
      if (s.ok()) s = EncodeUpdate(update, IndexCoding::kPlain32, &plain);
      std::fill(decoded.begin(), decoded.end(), 0.0f);
      if (s.ok()) s = DecodeAdd(rice, 1.0f, absl::MakeSpan(decoded));
      if (!s.ok()) {
        std::fprintf(stderr, "%s step %d: %s\n", layer.name.c_str(), t, s.ToString().c_str());
        return 1;
      }
      st.sent += update.indices.size();
      st.rice_bytes += rice.size();
      st.plain_bytes += plain.size();

      const absl::Span<const float> r = state.residue();
      double max_sum = 0.0, max_err = 0.0;
      for (size_t i = 0; i < n; ++i) {
        sum_grad[i] += grad[i];
        sum_decoded[i] += decoded[i];
        max_sum = std::max(max_sum, std::fabs(sum_grad[i]));
        max_err = std::max(max_err, std::fabs(sum_grad[i] - sum_decoded[i] - r[i]));
      }
      const double rel = max_sum > 0.0 ? max_err / max_sum : max_err;
      st.max_error = std::max(st.max_error, rel);
    }

    const uint64_t dense = uint64_t{4} * n * static_cast<uint64_t>(steps);
    const double density =
        static_cast<double>(st.sent) / (static_cast<double>(n) * static_cast<double>(steps));
    const double sent = static_cast<double>(std::max<uint64_t>(st.sent, 1));
    const bool layer_ok = st.max_error <= tolerance;
    ok = ok && layer_ok;
    std::printf("%-6s %-11s %9zu %4u %7.3f%% %10.2f %10.2f %10.1fx %8.1e%s\n",
                layer.name.c_str(), layer.shape.c_str(), n, layer.bin_size, 100.0 * density,
                8.0 * static_cast<double>(st.rice_bytes) / sent,
                8.0 * static_cast<double>(st.plain_bytes) / sent,
                static_cast<double>(dense) / static_cast<double>(st.rice_bytes),
                st.max_error, layer_ok ? "" : " FAIL");
    total_dense += dense;
    total_rice += st.rice_bytes;
    total_plain += st.plain_bytes;
  }

  std::printf("\ntotal: dense %.2f MB, sent %.3f MB with rice (%.3f MB with plain32): "
              "%.1fx smaller, %.2f%% of the bytes saved\n",
              static_cast<double>(total_dense) / 1e6, static_cast<double>(total_rice) / 1e6,
              static_cast<double>(total_plain) / 1e6,
              static_cast<double>(total_dense) / static_cast<double>(total_rice),
              100.0 * (1.0 - static_cast<double>(total_rice) / static_cast<double>(total_dense)));
  std::printf("error feedback (sum g == sum decoded + residue, rel. tol %.0e): %s\n", tolerance,
              ok ? "holds for every layer and step" : "VIOLATED");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace adaps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Compresses a synthetic gradient stream with AdaComp, layer by layer, and prints the "
      "density, bits per sent element, compression rate and total saving.\n"
      "Usage: adaps-codec-demo [--steps=100] [--seed=1]");
  // --help lists the flags of this file (absl matches on the binary's name by default).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::StrContains(path, "codec_demo");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  return adaps::Run();
}
