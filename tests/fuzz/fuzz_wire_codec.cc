// Fuzz target for the decoder of the sparse ternary (and every other) update encoding, and
// of segmented containers (fusion buckets): the bytes a server receives in each push and a
// worker in each recompressed pull, and of sparse and forwarded pull answers
// (DecodeAssignCopy, DecodeForwardedCopy). Decoding must never crash, read or write out of
// bounds, or write anything when it fails.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/wire_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> bytes(data, size);
  adaps::CompressedUpdate update;
  const absl::Status decoded = adaps::DecodeUpdate(bytes, &update);
  auto header = adaps::PeekHeader(bytes);
  if (decoded.ok() && !header.ok()) std::abort();  // a decodable buffer has a valid header
  // The one parse a server makes of a push (ParseUpdate) checks the header and a container's
  // table: it passes what decodes, and nothing without a valid header.
  auto parsed = adaps::ParseUpdate(bytes);
  if (parsed.ok() && !header.ok()) std::abort();
  if (decoded.ok() && !parsed.ok()) std::abort();

  // DecodeAdd into a buffer of the claimed length (capped), with guard cells either side.
  size_t n = header.ok() ? header->length : 16;
  if (n > (1u << 16)) n = 1u << 16;
  std::vector<float> dst(n + 2, 0.0f);
  const absl::Status added = adaps::DecodeAdd(bytes, 1.0f, absl::MakeSpan(dst.data() + 1, n));
  if (dst.front() != 0.0f || dst.back() != 0.0f) std::abort();
  if (!added.ok()) {
    for (float v : dst) {
      if (v != 0.0f) std::abort();  // a failed decode wrote something
    }
  }
  // A sparse pull answer: assigned iff it is one valid Top-k update of the buffer's length;
  // a failure writes neither buffer.
  for (bool zero_rest : {false, true}) {
    std::vector<float> replica(n + 2, 3.0f), copy(n + 2, 5.0f);
    const absl::Status assigned =
        adaps::DecodeAssignCopy(bytes, zero_rest, absl::MakeSpan(replica.data() + 1, n),
                                absl::MakeSpan(copy.data() + 1, n));
    if (replica.front() != 3.0f || replica.back() != 3.0f || copy.front() != 5.0f ||
        copy.back() != 5.0f) {
      std::abort();
    }
    const bool valid = decoded.ok() && header->segments == 0 && header->length == n &&
                       header->kind == adaps::CompressorKind::kTopK;
    if (assigned.ok() != valid) std::abort();
    for (size_t i = 1; i <= n; ++i) {
      if (!assigned.ok() && (replica[i] != 3.0f || copy[i] != 5.0f)) std::abort();
      if (assigned.ok() && std::memcmp(&replica[i], &copy[i], sizeof(float)) != 0) std::abort();
    }
  }
  // A forwarded pull answer, a mean step's and an SGD step's: the input itself, and the
  // input forwarded twice (the second time left out as the puller's own push). A failure
  // writes neither buffer; the wrapped form replays iff the input is a push DecodeAdd takes
  // for this length.
  for (int form = 0; form < 4; ++form) {
    const bool sgd = form >= 2;
    std::vector<uint8_t> wrapped;
    absl::Span<const uint8_t> answer = bytes;
    if (form % 2 == 1) {
      if (!(sgd ? adaps::EncodeForwardedSgd(0.5f, 0.25f, {bytes, bytes}, &wrapped, 1)
                : adaps::EncodeForwarded(0.5f, {bytes, bytes}, &wrapped, 1))
               .ok()) {
        std::abort();
      }
      answer = wrapped;
    }
    std::vector<float> replica(n + 2, 3.0f), copy(n + 2, 5.0f);
    const absl::Span<float> r = absl::MakeSpan(replica.data() + 1, n);
    const absl::Span<float> c = absl::MakeSpan(copy.data() + 1, n);
    const absl::Status replayed = sgd ? adaps::DecodeForwardedSgdCopy(answer, r, c, &bytes)
                                      : adaps::DecodeForwardedCopy(answer, r, c, &bytes);
    if (replica.front() != 3.0f || replica.back() != 3.0f || copy.front() != 5.0f ||
        copy.back() != 5.0f) {
      std::abort();
    }
    if (form % 2 == 1 && replayed.ok() != added.ok()) std::abort();
    for (size_t i = 1; i <= n; ++i) {
      if (!replayed.ok() && (replica[i] != 3.0f || copy[i] != 5.0f)) std::abort();
      if (replayed.ok() && std::memcmp(&replica[i], &copy[i], sizeof(float)) != 0) std::abort();
    }
  }
  if (header.ok() && header->segments > 0) {
    // A segmented container (a fusion bucket): it adds iff its framing and every segment
    // are valid, and what adds re-encodes to a container with the same segments.
    if (decoded.ok()) std::abort();  // never a single update
    auto views = adaps::SplitSegmented(bytes);
    bool valid = views.ok() && header->length == n;
    std::vector<adaps::WireSegment> table;
    std::vector<absl::Span<const uint8_t>> parts;
    if (views.ok()) {
      for (const adaps::SegmentView& v : *views) {
        adaps::CompressedUpdate part;
        valid = valid && adaps::DecodeUpdate(v.bytes, &part).ok();
        table.push_back(v.segment);
        parts.push_back(v.bytes);
      }
    }
    if (added.ok() != valid) std::abort();
    if (valid) {
      std::vector<uint8_t> again;
      if (!adaps::EncodeSegmented(table, parts, &again).ok()) std::abort();
      auto twice = adaps::SplitSegmented(again);
      if (!twice.ok() || twice->size() != table.size()) std::abort();
    }
    return 0;
  }
  if (added.ok() != (decoded.ok() && header->length == n)) std::abort();

  if (decoded.ok()) {
    // What decodes re-encodes and decodes to the same update.
    std::vector<uint8_t> again;
    if (!adaps::EncodeUpdate(update, header->coding, &again).ok()) std::abort();
    adaps::CompressedUpdate twice;
    if (!adaps::DecodeUpdate(again, &twice).ok()) std::abort();
    if (twice.indices != update.indices || twice.negative != update.negative ||
        twice.values != update.values || twice.sign_bits != update.sign_bits) {
      std::abort();
    }
  }
  return 0;
}
