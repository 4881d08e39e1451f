// Forwarded pull answers (common/wire_codec.h, schemas/README.md "Sparse pulls"): a mean
// server's step as the pushes it added, replayed by the worker with the server's own float
// operations. Everything read from the network is checked before anything is written.
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "common/wire_internal.h"

namespace adaps {
namespace {

constexpr uint32_t kForwardedMagic = 0x31574641;  // "AFW1", little-endian
// More pushes than any cluster has workers: a count beyond it is damage, not a step.
constexpr uint32_t kMaxForwardedPushes = 1u << 20;
constexpr uint32_t kOwnPush = 0xFFFFFFFF;  // the size that says: the puller's own push

// Whether `bytes` is a whole, valid push of `length` elements (what DecodeAdd accepts),
// without writing anything.
absl::Status ValidatePush(absl::Span<const uint8_t> bytes, size_t length) {
  ADAPS_ASSIGN_OR_RETURN(WireHeader head, PeekHeader(bytes));
  if (head.length != length) {
    return absl::DataLossError(
        absl::StrCat("forwarded push of ", head.length, " elements for ", length));
  }
  thread_local CompressedUpdate update;
  if (head.segments == 0) return DecodeUpdate(bytes, &update);
  ADAPS_ASSIGN_OR_RETURN(std::vector<SegmentView> views, SplitSegmented(bytes));
  size_t at = 0;
  for (const SegmentView& v : views) {
    ADAPS_RETURN_IF_ERROR(DecodeUpdate(v.bytes, &update));
    at += v.segment.length;
  }
  if (at != length) return absl::DataLossError("segments do not cover the forwarded push");
  return absl::OkStatus();
}

}  // namespace

size_t ForwardedSize(absl::Span<const size_t> push_sizes) {
  size_t n = 12;
  for (size_t s : push_sizes) n += 4 + s;
  return n;
}

absl::Status EncodeForwarded(float scale, absl::Span<const absl::Span<const uint8_t>> pushes,
                             std::vector<uint8_t>* out, int own) {
  out->clear();
  if (pushes.empty() || pushes.size() > kMaxForwardedPushes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a forwarded answer of ", pushes.size(), " pushes"));
  }
  if (!std::isfinite(scale) || !(scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("forwarded answer with scale ", scale));
  }
  size_t total = 12;
  for (absl::Span<const uint8_t> p : pushes) {
    if (p.size() >= kOwnPush) return absl::InvalidArgumentError("a forwarded push over 4 GiB");
    total += 4 + p.size();
  }
  out->reserve(total);
  wire_internal::PutU32(out, kForwardedMagic);
  wire_internal::PutU32(out, static_cast<uint32_t>(pushes.size()));
  wire_internal::PutF32(out, scale);
  for (size_t i = 0; i < pushes.size(); ++i) {
    if (static_cast<int>(i) == own) {
      wire_internal::PutU32(out, kOwnPush);
      continue;
    }
    wire_internal::PutU32(out, static_cast<uint32_t>(pushes[i].size()));
    out->insert(out->end(), pushes[i].begin(), pushes[i].end());
  }
  return absl::OkStatus();
}

absl::Status DecodeForwardedCopy(absl::Span<const uint8_t> bytes, absl::Span<float> dst,
                                 absl::Span<float> copy, const absl::Span<const uint8_t>* own) {
  if (copy.size() != dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat("copy of ", copy.size(), " elements for ",
                                                   dst.size()));
  }
  wire_internal::ByteReader r(bytes);
  uint32_t magic = 0, count = 0;
  float scale = 0.0f;
  ADAPS_RETURN_IF_ERROR(r.U32(&magic));
  if (magic != kForwardedMagic) return absl::DataLossError("not a forwarded pull answer");
  ADAPS_RETURN_IF_ERROR(r.U32(&count));
  ADAPS_RETURN_IF_ERROR(r.F32(&scale));
  if (count == 0 || count > kMaxForwardedPushes || !std::isfinite(scale) || !(scale > 0.0f)) {
    return absl::DataLossError(
        absl::StrCat("forwarded answer of ", count, " pushes with scale ", scale));
  }
  // Two passes: check every push first (so a damaged answer changes nothing), then replay.
  std::vector<absl::Span<const uint8_t>> pushes;
  pushes.reserve(count);
  bool own_used = false;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t size = 0;
    ADAPS_RETURN_IF_ERROR(r.U32(&size));
    if (size == kOwnPush) {
      if (own == nullptr || own_used) {
        return absl::DataLossError(
            own_used ? "a forwarded answer leaves out two pushes"
                     : "a forwarded answer leaves out the puller's push, which it does not hold");
      }
      own_used = true;
      pushes.push_back(*own);
      ADAPS_RETURN_IF_ERROR(ValidatePush(pushes.back(), dst.size()));
      continue;
    }
    if (size > r.remaining()) {
      return absl::DataLossError(absl::StrCat("forwarded push ", i, " of ", size,
                                              " bytes, ", r.remaining(), " left"));
    }
    pushes.push_back(bytes.subspan(r.pos(), size));
    ADAPS_RETURN_IF_ERROR(ValidatePush(pushes.back(), dst.size()));
    ADAPS_RETURN_IF_ERROR(r.Skip(size));
  }
  if (r.remaining() != 0) {
    return absl::DataLossError(absl::StrCat(r.remaining(), " bytes after the forwarded pushes"));
  }
  // The server's step: agg = 0; agg += push (in its arrival order); params = agg * scale
  // (common/optimizer.cc, MeanStep on Grad<true>): the same float operations, so the same bits.
  float* d = dst.data();
  if (!dst.empty()) std::memset(d, 0, dst.size() * sizeof(float));
  for (absl::Span<const uint8_t> p : pushes) ADAPS_RETURN_IF_ERROR(DecodeAdd(p, 1.0f, dst));
  float* c = copy.data();
  for (size_t j = 0; j < dst.size(); ++j) {
    const float v = d[j] * scale;
    d[j] = v;
    c[j] = v;
  }
  return absl::OkStatus();
}

}  // namespace adaps
