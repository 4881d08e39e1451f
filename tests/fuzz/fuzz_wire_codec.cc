// Fuzz target for the decoder of the sparse ternary (and every other) update encoding: the
// bytes a server receives in each push and a worker in each recompressed pull. Decoding
// must never crash, read or write out of bounds, or write anything when it fails.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/wire_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> bytes(data, size);
  adaps::CompressedUpdate update;
  const absl::Status decoded = adaps::DecodeUpdate(bytes, &update);
  auto header = adaps::PeekHeader(bytes);
  if (decoded.ok() && !header.ok()) std::abort();  // a decodable buffer has a valid header

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
