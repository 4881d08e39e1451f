// Writes a small seed corpus for the wire-codec fuzz target: one valid encoding of each
// update kind in each index coding. Run once; the seeds are committed.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/compressor.h"
#include "common/wire_codec.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  std::vector<float> g(300);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 37) % 23) - 11.0f;
  // A segmented container (a fusion bucket) of one update of each kind, Rice-coded.
  std::vector<std::vector<uint8_t>> parts;
  std::vector<adaps::WireSegment> table;
  for (auto kind : {adaps::CompressorKind::kDense, adaps::CompressorKind::kAdaComp,
                    adaps::CompressorKind::kTopK, adaps::CompressorKind::kSign}) {
    adaps::CompressorOptions o;
    o.kind = kind;
    o.bin_size = 50;
    o.topk_fraction = 0.05;
    auto c = adaps::MakeCompressor(o);
    adaps::SliceState s(g.size());
    adaps::CompressedUpdate u;
    if (!c.ok() || !(*c)->Compress(g, s, u).ok()) return 1;
    for (auto coding : {adaps::IndexCoding::kRice, adaps::IndexCoding::kPlain32}) {
      std::vector<uint8_t> bytes;
      if (!adaps::EncodeUpdate(u, coding, &bytes).ok()) return 1;
      if (coding == adaps::IndexCoding::kRice) {
        parts.push_back(bytes);
        table.push_back(adaps::WireSegment{static_cast<uint32_t>(g.size()), 50});
      }
      const std::string name = std::string(argv[1]) + "/" + adaps::CompressorKindName(kind) +
                               (coding == adaps::IndexCoding::kRice ? "_rice" : "_plain32");
      std::ofstream(name, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
  }
  std::vector<absl::Span<const uint8_t>> spans(parts.begin(), parts.end());
  std::vector<uint8_t> bytes;
  if (!adaps::EncodeSegmented(table, spans, &bytes).ok()) return 1;
  std::ofstream(std::string(argv[1]) + "/segmented_rice", std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  // Forwarded pull answers of a mean step and of an SGD step: the AdaComp push as two
  // workers' pushes.
  const absl::Span<const uint8_t> adacomp = parts[1];
  for (bool sgd : {false, true}) {
    std::vector<uint8_t> answer;
    const std::vector<absl::Span<const uint8_t>> two = {adacomp, adacomp};
    if (!(sgd ? adaps::EncodeForwardedSgd(0.5f, 0.1f, two, &answer)
              : adaps::EncodeForwarded(0.5f, two, &answer))
             .ok()) {
      return 1;
    }
    std::ofstream(std::string(argv[1]) + (sgd ? "/forwarded_sgd" : "/forwarded_mean"),
                  std::ios::binary)
        .write(reinterpret_cast<const char*>(answer.data()),
               static_cast<std::streamsize>(answer.size()));
  }
  return 0;
}
