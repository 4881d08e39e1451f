// Segmented containers (common/wire_codec.h): a fusion bucket's push or recompressed pull,
// one ordinary encoding per member. Everything read from the network is bounds-checked
// before anything is written: a hostile table is kDataLoss and changes nothing.
#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "common/wire_internal.h"

namespace adaps {
namespace wire_internal {

absl::Status ReadSegmentedHeader(ByteReader& r, WireHeader* h) {
  uint8_t coding = 0;
  ADAPS_RETURN_IF_ERROR(r.U8(&coding));
  if (coding != 0) {
    return absl::DataLossError(absl::StrCat("segmented container with coding byte ", coding));
  }
  h->kind = CompressorKind::kDense;
  h->coding = IndexCoding::kPlain32;
  h->bin_size = 0;
  ADAPS_RETURN_IF_ERROR(r.Varint32(&h->length));
  h->count = h->length;
  ADAPS_RETURN_IF_ERROR(r.Varint32(&h->segments));
  if (h->segments == 0 || h->segments > h->length) {
    return absl::DataLossError(absl::StrCat("segmented container of ", h->length,
                                            " elements with ", h->segments, " segments"));
  }
  return absl::OkStatus();
}

absl::Status DecodeAddSegments(absl::Span<const SegmentView> segments, float factor,
                               absl::Span<float> dst, std::vector<uint32_t>* touched) {
  // Every segment is validated by adding it into a copy; only a wholly valid container
  // reaches dst (the same additions, so the result is bit for bit that of adding directly).
  thread_local std::vector<float> scratch;
  thread_local std::vector<uint32_t> part;
  scratch.assign(dst.begin(), dst.end());
  const size_t touched_before = touched != nullptr ? touched->size() : 0;
  size_t at = 0;
  absl::Status status;
  for (const SegmentView& v : segments) {
    if (v.segment.length > scratch.size() - at) {
      status = absl::DataLossError("segments do not cover the update");
      break;
    }
    const absl::Span<float> seg = absl::MakeSpan(scratch.data() + at, v.segment.length);
    if (touched == nullptr) {
      status = DecodeAdd(v.bytes, factor, seg);
    } else {
      part.clear();
      status = DecodeAddTouched(v.bytes, factor, seg, &part);
      for (uint32_t i : part) touched->push_back(static_cast<uint32_t>(at) + i);
    }
    if (!status.ok()) break;
    at += v.segment.length;
  }
  if (status.ok() && at != dst.size()) {
    status = absl::DataLossError("segments do not cover the update");
  }
  if (!status.ok()) {
    if (touched != nullptr) touched->resize(touched_before);
    return status;
  }
  std::copy(scratch.begin(), scratch.end(), dst.begin());
  return absl::OkStatus();
}

}  // namespace wire_internal

namespace {

// A part's header, checked against its segment. `what` is kDataLoss (decoding) or
// kInvalidArgument (encoding).
absl::Status CheckPart(absl::Span<const uint8_t> part, const WireSegment& seg, size_t i,
                       absl::StatusCode what) {
  auto header = PeekHeader(part);
  if (!header.ok()) {
    return absl::Status(what, absl::StrCat("segment ", i, ": ", header.status().message()));
  }
  if (header->segments != 0) {
    return absl::Status(what, absl::StrCat("segment ", i, " is itself segmented"));
  }
  if (header->length != seg.length) {
    return absl::Status(what, absl::StrCat("segment ", i, " holds ", header->length,
                                           " elements, the table says ", seg.length));
  }
  if (header->kind == CompressorKind::kAdaComp && header->bin_size != seg.bin_size) {
    return absl::Status(what, absl::StrCat("segment ", i, " has bin size ", header->bin_size,
                                           ", the table says ", seg.bin_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EncodeSegmented(absl::Span<const WireSegment> table,
                             absl::Span<const absl::Span<const uint8_t>> parts,
                             std::vector<uint8_t>* out) {
  using wire_internal::PutU8;
  using wire_internal::PutVarint;
  out->clear();
  if (table.empty() || table.size() != parts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("segmented container of ", table.size(),
                                                   " segments and ", parts.size(), " parts"));
  }
  uint64_t total = 0, bytes = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i].length == 0 || table[i].bin_size == 0) {
      return absl::InvalidArgumentError(absl::StrCat("segment ", i, " is empty or has bin size 0"));
    }
    ADAPS_RETURN_IF_ERROR(
        CheckPart(parts[i], table[i], i, absl::StatusCode::kInvalidArgument));
    total += table[i].length;
    bytes += parts[i].size();
  }
  if (total > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError("segmented container longer than 2^32-1 elements");
  }
  out->reserve(16 + 12 * table.size() + bytes);
  PutU8(out, kWireMagic);
  PutU8(out, kWireFormatVersion);
  PutU8(out, kSegmentedKind);
  PutU8(out, 0);
  PutVarint(out, total);
  PutVarint(out, table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    PutVarint(out, table[i].length);
    PutVarint(out, table[i].bin_size);
    PutVarint(out, parts[i].size());
  }
  for (absl::Span<const uint8_t> part : parts) out->insert(out->end(), part.begin(), part.end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SegmentView>> SplitSegmented(absl::Span<const uint8_t> bytes) {
  ADAPS_ASSIGN_OR_RETURN(ParsedUpdate parsed, ParseUpdate(bytes));
  if (parsed.header.segments == 0) return absl::InvalidArgumentError("not a segmented container");
  return std::move(parsed.segments);
}

namespace wire_internal {

absl::Status ReadSegmentTable(ByteReader& r, const WireHeader& h,
                              absl::Span<const uint8_t> bytes, std::vector<SegmentView>* out) {
  // Each table entry takes at least 3 bytes: a count past that is damage, found before
  // anything is sized by it.
  if (uint64_t{h.segments} * 3 > r.remaining()) return ByteReader::Truncated();
  std::vector<SegmentView>& views = *out;
  views.assign(h.segments, SegmentView());
  uint64_t total = 0, body = 0;
  for (uint32_t i = 0; i < h.segments; ++i) {
    uint32_t nbytes = 0;
    WireSegment& seg = views[i].segment;
    ADAPS_RETURN_IF_ERROR(r.Varint32(&seg.length));
    ADAPS_RETURN_IF_ERROR(r.Varint32(&seg.bin_size));
    ADAPS_RETURN_IF_ERROR(r.Varint32(&nbytes));
    if (seg.length == 0 || seg.bin_size == 0) {
      return absl::DataLossError(absl::StrCat("segment ", i, " is empty or has bin size 0"));
    }
    total += seg.length;
    body += nbytes;
    views[i].bytes = absl::MakeConstSpan(bytes.data(), nbytes);  // offset fixed below
  }
  if (total != h.length) {
    return absl::DataLossError(absl::StrCat("segments hold ", total,
                                            " elements, the container says ", h.length));
  }
  if (body != r.remaining()) {
    return absl::DataLossError(absl::StrCat("segments hold ", body, " bytes, the container has ",
                                            r.remaining()));
  }
  size_t at = r.pos();
  for (uint32_t i = 0; i < h.segments; ++i) {
    const size_t n = views[i].bytes.size();
    views[i].bytes = bytes.subspan(at, n);
    at += n;
    ADAPS_RETURN_IF_ERROR(CheckPart(views[i].bytes, views[i].segment, i,
                                    absl::StatusCode::kDataLoss));
  }
  return absl::OkStatus();
}

}  // namespace wire_internal

}  // namespace adaps
