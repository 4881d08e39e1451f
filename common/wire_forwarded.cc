// Forwarded pull answers (common/wire_codec.h, schemas/README.md "Sparse pulls"): a mean
// server's step as the pushes it added, replayed by the worker with the server's own float
// operations. Everything read from the network is checked before anything is written.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/optimizer.h"
#include "common/scatter.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "common/wire_internal.h"

namespace adaps {
namespace {

constexpr uint32_t kForwardedMagic = 0x31574641;     // "AFW1", little-endian: a mean step
// "AFS2": an SGD step (and its rate), each push stepped in turn (ApplySgdParts). ("AFS1",
// until 2026-12-04, stepped once on the pushes' sum; a worker meeting one says so.)
constexpr uint32_t kForwardedSgdMagic = 0x32534641;
constexpr uint32_t kForwardedSgdMagicV1 = 0x31534641;
// More pushes than any cluster has workers: a count beyond it is damage, not a step.
constexpr uint32_t kMaxForwardedPushes = 1u << 20;
constexpr uint32_t kOwnPush = 0xFFFFFFFF;  // the size that says: the puller's own push

}  // namespace

absl::Status DecodePushParts(absl::Span<const uint8_t> bytes, size_t length,
                             std::vector<DecodedPart>& parts, size_t* used, bool* sparse) {
  ADAPS_ASSIGN_OR_RETURN(ParsedUpdate update, ParseUpdate(bytes));
  return DecodePushParts(update, length, parts, used, sparse);
}

absl::Status DecodePushParts(const ParsedUpdate& update, size_t length,
                             std::vector<DecodedPart>& parts, size_t* used, bool* sparse) {
  const size_t start = *used;
  absl::Status st = [&]() -> absl::Status {
    const WireHeader& head = update.header;
    if (head.length != length) {
      return absl::DataLossError(
          absl::StrCat("forwarded push of ", head.length, " elements for ", length));
    }
    // `part`: a segment's bytes, or null: the push itself, parsed already.
    auto add = [&](const absl::Span<const uint8_t>* part, uint32_t offset) -> absl::Status {
      if (*used == parts.size()) parts.emplace_back();
      DecodedPart& p = parts[(*used)++];
      p.offset = offset;
      ADAPS_RETURN_IF_ERROR(part != nullptr ? DecodeUpdate(*part, &p.update)
                                            : DecodeUpdate(update, &p.update));
      if (p.update.kind != CompressorKind::kAdaComp &&
          p.update.kind != CompressorKind::kTopK) {
        *sparse = false;
      }
      return absl::OkStatus();
    };
    if (head.segments == 0) return add(nullptr, 0);
    uint64_t at = 0;
    for (const SegmentView& v : update.segments) {
      ADAPS_RETURN_IF_ERROR(add(&v.bytes, static_cast<uint32_t>(at)));
      at += v.segment.length;
    }
    if (at != length) return absl::DataLossError("segments do not cover the forwarded push");
    return absl::OkStatus();
  }();
  if (!st.ok()) *used = start;
  return st;
}

void ApplySgdParts(absl::Span<const DecodedPart> parts, float scale, float lr,
                   absl::Span<float> p, float* copy) {
  const size_t n = p.size();
  float* d = p.data();
  // Blocked: each block of p takes every part's steps (in part order, so each element's in
  // push order) while it is in cache; within a block a part's elements are ascending.
  constexpr size_t kBlock = 16384;  // 64 KiB of floats
  thread_local std::vector<size_t> cursor;
  cursor.assign(parts.size(), 0);
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    for (size_t k = 0; k < parts.size(); ++k) {
      const CompressedUpdate& u = parts[k].update;
      const size_t offset = parts[k].offset;
      if (offset >= e || offset + u.length <= b) continue;  // nothing of this part here
      float* base = d + offset;
      const size_t lo = std::max(b, offset) - offset, hi = std::min(e, offset + u.length) - offset;
      // A sparse part's elements in this block (from its cursor on), stepped with value(i).
      auto step_sparse = [&](auto value) {
        const size_t from = cursor[k];
        size_t to = from;
        while (to < u.indices.size() && u.indices[to] < hi) ++to;
        ForEachScattered(
            u.indices.data() + from, to - from,
            [&](size_t j) {
              SgdStep(lr, 0.0f, value(from + j) * scale, base[u.indices[from + j]]);
            },
            base);
        cursor[k] = to;
      };
      switch (u.kind) {
        case CompressorKind::kAdaComp: {
          const float pos = 1.0f * u.scale;  // DecodeAdd's factor * scale
          step_sparse([&](size_t i) { return u.negative[i] ? -pos : pos; });
          break;
        }
        case CompressorKind::kTopK:
          step_sparse([&](size_t i) { return 1.0f * u.values[i]; });
          break;
        case CompressorKind::kDense:
          for (size_t i = lo; i < hi; ++i) {
            SgdStep(lr, 0.0f, (1.0f * u.values[i]) * scale, base[i]);
          }
          break;
        case CompressorKind::kSign: {
          const float a = 1.0f * u.scale, c = 1.0f * u.scale_neg;
          for (size_t i = lo; i < hi; ++i) {
            const bool set = (u.sign_bits[i / 64] >> (i % 64)) & 1;
            SgdStep(lr, 0.0f, (set ? c : a) * scale, base[i]);
          }
          break;
        }
      }
    }
    if (copy != nullptr && copy != d) std::memcpy(copy + b, d + b, (e - b) * sizeof(float));
  }
}

size_t ForwardedSize(absl::Span<const size_t> push_sizes) {
  size_t n = 12;
  for (size_t s : push_sizes) n += 4 + s;
  return n;
}

namespace {

// The two layouts differ only in the magic and SGD's learning rate after the scale.
absl::Status EncodeForwardedAny(uint32_t magic, float scale, const float* lr,
                                absl::Span<const absl::Span<const uint8_t>> pushes,
                                std::vector<uint8_t>* out, int own) {
  out->clear();
  if (pushes.empty() || pushes.size() > kMaxForwardedPushes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a forwarded answer of ", pushes.size(), " pushes"));
  }
  if (!std::isfinite(scale) || !(scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("forwarded answer with scale ", scale));
  }
  if (lr != nullptr && (!std::isfinite(*lr) || !(*lr >= 0.0f))) {
    return absl::InvalidArgumentError(absl::StrCat("forwarded SGD step at rate ", *lr));
  }
  size_t total = lr != nullptr ? 16 : 12;
  for (absl::Span<const uint8_t> p : pushes) {
    if (p.size() >= kOwnPush) return absl::InvalidArgumentError("a forwarded push over 4 GiB");
    total += 4 + p.size();
  }
  out->reserve(total);
  wire_internal::PutU32(out, magic);
  wire_internal::PutU32(out, static_cast<uint32_t>(pushes.size()));
  wire_internal::PutF32(out, scale);
  if (lr != nullptr) wire_internal::PutF32(out, *lr);
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

// A forwarded answer read and every push in it decoded (so checked) for a slice of `n`
// elements, before anything is written: the pushes in order (the puller's own where the
// answer left it out), their parts in `parts[0, used)`, `sparse` false when a part is dense
// or sign.
struct Forwarded {
  float scale = 0.0f;
  float lr = 0.0f;  // (SGD)
  std::vector<absl::Span<const uint8_t>> pushes;
  size_t used = 0;
  bool sparse = true;
};

absl::Status ParseForwarded(absl::Span<const uint8_t> bytes, size_t n, bool sgd,
                            const absl::Span<const uint8_t>* own,
                            std::vector<DecodedPart>& parts, Forwarded* f) {
  wire_internal::ByteReader r(bytes);
  uint32_t magic = 0, count = 0;
  ADAPS_RETURN_IF_ERROR(r.U32(&magic));
  if (magic != (sgd ? kForwardedSgdMagic : kForwardedMagic)) {
    if (magic == kForwardedMagic || magic == kForwardedSgdMagic) {
      return absl::DataLossError(sgd ? "a forwarded mean step where an SGD step was expected"
                                     : "a forwarded SGD step where a mean step was expected");
    }
    if (magic == kForwardedSgdMagicV1) {
      return absl::DataLossError(
          "a forwarded SGD step of the layout before 2026-12-04 (AFS1: the step on the "
          "pushes' sum), from a server of an older build");
    }
    return absl::DataLossError("not a forwarded pull answer");
  }
  ADAPS_RETURN_IF_ERROR(r.U32(&count));
  ADAPS_RETURN_IF_ERROR(r.F32(&f->scale));
  if (count == 0 || count > kMaxForwardedPushes || !std::isfinite(f->scale) ||
      !(f->scale > 0.0f)) {
    return absl::DataLossError(
        absl::StrCat("forwarded answer of ", count, " pushes with scale ", f->scale));
  }
  if (sgd) {
    ADAPS_RETURN_IF_ERROR(r.F32(&f->lr));
    if (!std::isfinite(f->lr) || !(f->lr >= 0.0f)) {
      return absl::DataLossError(absl::StrCat("forwarded SGD step at rate ", f->lr));
    }
  }
  f->pushes.reserve(count);
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
      f->pushes.push_back(*own);
      ADAPS_RETURN_IF_ERROR(DecodePushParts(f->pushes.back(), n, parts, &f->used, &f->sparse));
      continue;
    }
    if (size > r.remaining()) {
      return absl::DataLossError(absl::StrCat("forwarded push ", i, " of ", size,
                                              " bytes, ", r.remaining(), " left"));
    }
    f->pushes.push_back(bytes.subspan(r.pos(), size));
    ADAPS_RETURN_IF_ERROR(DecodePushParts(f->pushes.back(), n, parts, &f->used, &f->sparse));
    ADAPS_RETURN_IF_ERROR(r.Skip(size));
  }
  if (r.remaining() != 0) {
    return absl::DataLossError(absl::StrCat(r.remaining(), " bytes after the forwarded pushes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EncodeForwarded(float scale, absl::Span<const absl::Span<const uint8_t>> pushes,
                             std::vector<uint8_t>* out, int own) {
  return EncodeForwardedAny(kForwardedMagic, scale, nullptr, pushes, out, own);
}

absl::Status EncodeForwardedSgd(float scale, float lr,
                                absl::Span<const absl::Span<const uint8_t>> pushes,
                                std::vector<uint8_t>* out, int own) {
  return EncodeForwardedAny(kForwardedSgdMagic, scale, &lr, pushes, out, own);
}

absl::Status DecodeForwardedCopy(absl::Span<const uint8_t> bytes, absl::Span<float> dst,
                                 absl::Span<float> copy, const absl::Span<const uint8_t>* own) {
  if (copy.size() != dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat("copy of ", copy.size(), " elements for ",
                                                   dst.size()));
  }
  thread_local std::vector<DecodedPart> parts;
  Forwarded f;
  ADAPS_RETURN_IF_ERROR(ParseForwarded(bytes, dst.size(), /*sgd=*/false, own, parts, &f));
  const std::vector<absl::Span<const uint8_t>>& pushes = f.pushes;
  const size_t used = f.used;
  const float scale = f.scale;
  // The server's step: agg = 0; agg += push (in its arrival order); params = agg * scale
  // (common/optimizer.cc, MeanStep on Grad<true>): the same float operations on each
  // element in the same order, so the same bits.
  float* d = dst.data();
  float* c = copy.data();
  const size_t n = dst.size();
  if (!f.sparse) {  // a dense or sign part: every element, as DecodeAdd adds it
    if (n != 0) std::memset(d, 0, n * sizeof(float));
    for (absl::Span<const uint8_t> p : pushes) ADAPS_RETURN_IF_ERROR(DecodeAdd(p, 1.0f, dst));
    for (size_t j = 0; j < n; ++j) c[j] = d[j] = d[j] * scale;  // (c may be d)
    return absl::OkStatus();
  }
  // Blocked: each block of dst is zeroed, gets every part's additions (in push order) and is
  // scaled and copied while it is in cache, instead of four passes over the whole slice.
  thread_local std::vector<size_t> cursor;
  cursor.assign(used, 0);
  constexpr size_t kBlock = 16384;  // 64 KiB of floats
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    std::memset(d + b, 0, (e - b) * sizeof(float));
    for (size_t k = 0; k < used; ++k) {
      const CompressedUpdate& u = parts[k].update;
      float* base = d + parts[k].offset;
      const size_t end = e - std::min<size_t>(e, parts[k].offset);  // this block, part-relative
      size_t j = cursor[k];
      const size_t sent = u.indices.size();
      if (u.kind == CompressorKind::kAdaComp) {
        const float pos = 1.0f * u.scale;  // DecodeAdd's factor * scale
        for (; j < sent && u.indices[j] < end; ++j) {
          base[u.indices[j]] += u.negative[j] ? -pos : pos;
        }
      } else {
        for (; j < sent && u.indices[j] < end; ++j) base[u.indices[j]] += 1.0f * u.values[j];
      }
      cursor[k] = j;
    }
    for (size_t j = b; j < e; ++j) c[j] = d[j] = d[j] * scale;
  }
  return absl::OkStatus();
}

absl::Status DecodeForwardedSgdCopy(absl::Span<const uint8_t> bytes, absl::Span<float> dst,
                                    absl::Span<float> copy,
                                    const absl::Span<const uint8_t>* own) {
  if (copy.size() != dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat("copy of ", copy.size(), " elements for ",
                                                   dst.size()));
  }
  thread_local std::vector<DecodedPart> parts;
  Forwarded f;
  ADAPS_RETURN_IF_ERROR(ParseForwarded(bytes, dst.size(), /*sgd=*/true, own, parts, &f));
  // The server's step (server/shard.cc, a tracked SGD step): each push in its arrival order
  // stepped at its elements, ApplySgdParts on both sides.
  // The copy of each block is made while the block is in cache.
  ApplySgdParts(absl::MakeConstSpan(parts.data(), f.used), f.scale, f.lr, dst, copy.data());
  return absl::OkStatus();
}

}  // namespace adaps
