// A fusion bucket's segmented push and its members' traffic (worker/bucket.h).
#include "worker/bucket.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace adaps {
namespace {

// Member `t`'s wire bytes for `grad` (its residue left pending), dense when the compressed
// encoding would be larger than the dense one. Needs t.mu.
// `sent` gets the elements it sends.
absl::Status EncodeMember(Tensor& t, absl::Span<const float> grad, IndexCoding coding, bool flush,
                          std::vector<uint8_t>* bytes, SentElements* sent)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
  SliceState* residue = t.slices[0].residue.get();
  const SliceInfo whole{0, static_cast<uint32_t>(grad.size()), 0};
  *sent = SentElements();
  if (residue == nullptr) {
    sent->Add(nullptr, whole);
    return EncodeDense(grad, coding, bytes);
  }
  if (flush) {
    sent->Add(nullptr, whole);
    return EncodeAllPending(*residue, grad, coding, bytes);
  }
  ADAPS_RETURN_IF_ERROR(t.compressor->CompressPending(grad, *residue, t.update));
  ADAPS_RETURN_IF_ERROR(EncodeUpdate(t.update, coding, bytes));
  // Dense encoding: 4 header bytes, the varint length, 4 bytes per value.
  uint64_t dense = 4 + 4 * uint64_t{grad.size()};
  for (uint64_t n = grad.size(); n >= 0x80; n >>= 7) ++dense;
  if (bytes->size() <= dense) {
    sent->Add(&t.update, whole);
    return absl::OkStatus();
  }
  sent->Add(nullptr, whole);
  // Send everything the residue holds and the gradient, dense; nothing is left behind.
  return EncodeAllPending(*residue, grad, coding, bytes);
}

}  // namespace

std::vector<WireSegment> SegmentTable(const FusionBucket& b) {
  std::vector<WireSegment> table;
  for (const FusionBucket::Member& m : b.members) {
    table.push_back(WireSegment{m.length, m.t->spec.bin_size});
  }
  return table;
}

absl::StatusOr<std::vector<SharedBytes>> EncodeFusedPush(FusionBucket& b,
                                                         absl::Span<const float> grad,
                                                         IndexCoding coding, bool flush) {
  std::vector<std::vector<uint8_t>> parts(b.members.size());
  std::vector<SentElements> sent(b.members.size());
  // The container's table says each part's own bin size: a member's SetBinSize changes it
  // (the servers check the lengths against the declared table, whose bin sizes are the
  // downlink's).
  std::vector<WireSegment> table = SegmentTable(b);
  absl::Status status;
  for (size_t i = 0; i < b.members.size() && status.ok(); ++i) {
    const FusionBucket::Member& m = b.members[i];
    absl::MutexLock lock(&m.t->mu);
    if (m.t->spec.compression == Compression::kAdaComp) {
      table[i].bin_size = m.t->compressor->options().bin_size;
    }
    status =
        EncodeMember(*m.t, grad.subspan(m.offset, m.length), coding, flush, &parts[i], &sent[i]);
    if (!status.ok()) {
      status = absl::Status(status.code(),
                            absl::StrCat("gradient of '", m.t->spec.name, "': ", status.message()));
    }
  }
  auto bytes = std::make_shared<Bytes>();
  if (status.ok()) {
    std::vector<absl::Span<const uint8_t>> spans(parts.begin(), parts.end());
    status = EncodeSegmented(table, spans, bytes.get());
  }
  for (size_t i = 0; i < b.members.size(); ++i) {
    const FusionBucket::Member& m = b.members[i];
    absl::MutexLock lock(&m.t->mu);
    SliceState* residue = m.t->slices[0].residue.get();
    if (!status.ok()) {
      if (residue != nullptr) residue->Discard();
      continue;
    }
    if (residue != nullptr) residue->Commit();
    MeasureResidue(*m.t, flush);
    m.t->last_sent = std::move(sent[i]);
    ++m.t->traffic.pushes;
    m.t->traffic.push_wire_bytes += parts[i].size();
    m.t->traffic.push_dense_bytes += uint64_t{m.length} * sizeof(float);
    b.segment_push_bytes += parts[i].size();
  }
  if (!status.ok()) return status;
  return std::vector<SharedBytes>{std::move(bytes)};
}

TrafficCounters FusedTraffic(Tensor& member) {
  FusionBucket& b = *member.fused_into;
  TrafficCounters own, bucket;
  uint32_t length = 0;
  {
    absl::MutexLock lock(&member.mu);
    own = member.traffic;
    length = static_cast<uint32_t>(member.length);
  }
  uint64_t segments = 0, total = 0;
  {
    absl::MutexLock lock(&b.internal.mu);
    bucket = b.internal.traffic;
    segments = b.segment_push_bytes;
    total = b.internal.length;
  }
  if (total == 0) return own;
  const auto share = [&](uint64_t bytes) {
    return static_cast<uint64_t>(static_cast<double>(bytes) * length / total + 0.5);
  };
  own.push_wire_bytes += share(bucket.push_wire_bytes - std::min(segments, bucket.push_wire_bytes));
  own.pull_wire_bytes = share(bucket.pull_wire_bytes);
  // (The bucket's answers are each member's: one per step.)
  own.pulls_answered_sparse = bucket.pulls_answered_sparse;
  own.pulls_answered_forwarded = bucket.pulls_answered_forwarded;
  own.pulls_answered_dense = bucket.pulls_answered_dense;
  return own;
}

}  // namespace adaps
