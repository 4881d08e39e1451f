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
constexpr uint32_t kForwardedSgdMagic = 0x31534641;  // "AFS1": an SGD step (and its rate)
// More pushes than any cluster has workers: a count beyond it is damage, not a step.
constexpr uint32_t kMaxForwardedPushes = 1u << 20;
constexpr uint32_t kOwnPush = 0xFFFFFFFF;  // the size that says: the puller's own push

// One decoded push, or one segment of a segmented push, at its offset in the slice.
struct Part {
  uint32_t offset = 0;
  CompressedUpdate update;
};

// Decodes `bytes`, a push of `length` elements (what DecodeAdd accepts), into parts[*used...]
// (grown as needed, reused from call to call). `sparse` becomes false for a dense or sign
// part (every element). Writes nothing else.
absl::Status DecodePush(absl::Span<const uint8_t> bytes, size_t length, std::vector<Part>& parts,
                        size_t* used, bool* sparse) {
  ADAPS_ASSIGN_OR_RETURN(WireHeader head, PeekHeader(bytes));
  if (head.length != length) {
    return absl::DataLossError(
        absl::StrCat("forwarded push of ", head.length, " elements for ", length));
  }
  auto add = [&](absl::Span<const uint8_t> part, uint32_t offset) -> absl::Status {
    if (*used == parts.size()) parts.emplace_back();
    Part& p = parts[(*used)++];
    p.offset = offset;
    ADAPS_RETURN_IF_ERROR(DecodeUpdate(part, &p.update));
    if (p.update.kind != CompressorKind::kAdaComp && p.update.kind != CompressorKind::kTopK) {
      *sparse = false;
    }
    return absl::OkStatus();
  };
  if (head.segments == 0) return add(bytes, 0);
  ADAPS_ASSIGN_OR_RETURN(std::vector<SegmentView> views, SplitSegmented(bytes));
  uint64_t at = 0;
  for (const SegmentView& v : views) {
    ADAPS_RETURN_IF_ERROR(add(v.bytes, static_cast<uint32_t>(at)));
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
                            const absl::Span<const uint8_t>* own, std::vector<Part>& parts,
                            Forwarded* f) {
  wire_internal::ByteReader r(bytes);
  uint32_t magic = 0, count = 0;
  ADAPS_RETURN_IF_ERROR(r.U32(&magic));
  if (magic != (sgd ? kForwardedSgdMagic : kForwardedMagic)) {
    if (magic == kForwardedMagic || magic == kForwardedSgdMagic) {
      return absl::DataLossError(sgd ? "a forwarded mean step where an SGD step was expected"
                                     : "a forwarded SGD step where a mean step was expected");
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
      ADAPS_RETURN_IF_ERROR(DecodePush(f->pushes.back(), n, parts, &f->used, &f->sparse));
      continue;
    }
    if (size > r.remaining()) {
      return absl::DataLossError(absl::StrCat("forwarded push ", i, " of ", size,
                                              " bytes, ", r.remaining(), " left"));
    }
    f->pushes.push_back(bytes.subspan(r.pos(), size));
    ADAPS_RETURN_IF_ERROR(DecodePush(f->pushes.back(), n, parts, &f->used, &f->sparse));
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
  thread_local std::vector<Part> parts;
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
  const size_t n = dst.size();
  thread_local std::vector<Part> parts;
  Forwarded f;
  ADAPS_RETURN_IF_ERROR(ParseForwarded(bytes, n, /*sgd=*/true, own, parts, &f));
  // The server's step (server/shard.cc, a tracked SGD step): agg += push for each push in
  // its arrival order (DecodeAdd, factor 1, from 0), then at each element some push holds,
  // SgdStep(lr, 0, agg * scale, p) once.
  float* d = dst.data();
  float* c = copy.data();
  if (!f.sparse) {  // a dense or sign member (rare): the server's own decode, whole slice
    std::vector<float> agg(n, 0.0f);
    std::vector<uint32_t> touched;
    for (absl::Span<const uint8_t> p : f.pushes) {
      // (Decoded once already: it cannot fail now.)
      ADAPS_RETURN_IF_ERROR(DecodeAddTouched(p, 1.0f, absl::MakeSpan(agg), &touched));
    }
    std::vector<uint64_t> seen((n + 63) / 64, 0);
    for (uint32_t i : touched) {
      const uint64_t bit = uint64_t{1} << (i & 63);
      if (seen[i >> 6] & bit) continue;
      seen[i >> 6] |= bit;
      SgdStep(f.lr, 0.0f, agg[i] * f.scale, d[i]);
    }
    if (n != 0 && c != d) std::memcpy(c, d, n * sizeof(float));
    return absl::OkStatus();
  }
  // Blocked, as DecodeForwardedCopy: each block's sums are made in a block-sized scratch
  // (zero between blocks), the block's touched elements stepped once each, and the block
  // copied while it is in cache; no scratch of the slice's size.
  constexpr size_t kBlock = 16384;
  thread_local std::vector<float> acc;
  thread_local std::vector<uint8_t> hit;
  thread_local std::vector<uint32_t> local;
  thread_local std::vector<size_t> cursor;
  if (acc.size() != kBlock) acc.assign(kBlock, 0.0f);
  if (hit.size() != kBlock) hit.assign(kBlock, 0);
  cursor.assign(f.used, 0);
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    local.clear();
    for (size_t k = 0; k < f.used; ++k) {
      const CompressedUpdate& u = parts[k].update;
      const size_t offset = parts[k].offset;
      const size_t end = e - std::min<size_t>(e, offset);  // this block, part-relative
      size_t j = cursor[k];
      const size_t sent = u.indices.size();
      const size_t from = j;
      if (u.kind == CompressorKind::kAdaComp) {
        const float pos = 1.0f * u.scale;  // DecodeAdd's factor * scale
        for (; j < sent && u.indices[j] < end; ++j) {
          acc[offset + u.indices[j] - b] += u.negative[j] ? -pos : pos;
        }
      } else {
        for (; j < sent && u.indices[j] < end; ++j) {
          acc[offset + u.indices[j] - b] += 1.0f * u.values[j];
        }
      }
      for (size_t i = from; i < j; ++i) {
        const size_t at = offset + u.indices[i] - b;
        if (!hit[at]) {
          hit[at] = 1;
          local.push_back(static_cast<uint32_t>(at));
          // The step below reads and writes d there: start the line's load now (in place,
          // d's block is not streamed through the cache by the copy).
          __builtin_prefetch(d + b + at, 1, 3);
        }
      }
      cursor[k] = j;
    }
    // In the order marked (each part ascending), the lines of d requested ahead as well:
    // the prefetch above has not always landed by now.
    float* db = d + b;
    ForEachScattered(
        local.data(), local.size(),
        [&](size_t i) {
          const uint32_t at = local[i];
          SgdStep(f.lr, 0.0f, acc[at] * f.scale, db[at]);
          acc[at] = 0.0f;
          hit[at] = 0;
        },
        db);
    if (c != d) std::memcpy(c + b, d + b, (e - b) * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace adaps
