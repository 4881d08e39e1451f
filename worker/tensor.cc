#include "worker/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/transport.h"
#include "worker/kinds.h"

namespace adaps {

absl::StatusOr<std::unique_ptr<Compressor>> MakeTensorCompressor(const TensorSpec& spec) {
  CompressorOptions copts;
  copts.kind = CodecKind(spec.compression);
  copts.bin_size = spec.bin_size;
  copts.topk_fraction = spec.topk_fraction;
  ADAPS_RETURN_IF_ERROR(ValidateOptions(copts));
  ADAPS_RET_CHECK(spec.bin_size > 0, absl::StatusCode::kInvalidArgument, "bin size is zero");
  return MakeCompressor(copts);
}

namespace {

// EncodeSlice for a tensor on a device: `grad` is device memory. AdaComp compresses there
// and only the update comes to the host; a dense tensor's gradient comes through host memory
// (the wire carries all of it anyway). A flush sends the residue alone (Worker::Leave's
// gradient is zero), zeroed at the commit.
absl::Status EncodeDeviceSlice(Tensor& t, size_t i, absl::Span<const float> grad,
                               IndexCoding coding, bool flush, Bytes* bytes)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
  DeviceResidue* residue = t.slices[i].device_residue.get();
  if (residue == nullptr || flush) {
    t.host_staging.resize(grad.size());
    const absl::Span<float> host = absl::MakeSpan(t.host_staging);
    ADAPS_RETURN_IF_ERROR(residue == nullptr
                              ? t.device->ToHost(host.data(), grad.data(), grad.size() * 4)
                              : residue->Download(host));
    return EncodeDense(host, coding, bytes);
  }
  ADAPS_RETURN_IF_ERROR(
      t.device_codec->CompressPending(grad.data(), grad.size(), *residue, t.update));
  return EncodeUpdate(t.update, coding, bytes);
}

// Ends a push's two phases on slice `rt`'s residue: commit (a flush: zero) when every slice
// succeeded, else discard.
absl::Status EndPush(SliceRt& rt, bool ok, bool flush) {
  if (rt.device_residue != nullptr) {
    DeviceResidue& r = *rt.device_residue;
    return !ok ? r.Discard() : flush ? r.Zero() : r.Commit();
  }
  if (rt.residue != nullptr) {
    if (ok) {
      rt.residue->Commit();
    } else {
      rt.residue->Discard();
    }
  }
  return absl::OkStatus();
}

// Phase one for slice `i`: its wire bytes, its new residue (if any) left pending.
absl::Status EncodeSlice(Tensor& t, size_t i, absl::Span<const float> grad, IndexCoding coding,
                         bool flush, Bytes* bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
  if (t.device != nullptr) return EncodeDeviceSlice(t, i, grad, coding, flush, bytes);
  SliceRt& rt = t.slices[i];
  if (rt.residue == nullptr) return EncodeDense(grad, coding, bytes);
  if (flush) return EncodeAllPending(*rt.residue, grad, coding, bytes);
  ADAPS_RETURN_IF_ERROR(t.compressor->CompressPending(grad, *rt.residue, t.update));
  return EncodeUpdate(t.update, coding, bytes);
}

// Adds the seconds of its life to `*sum` (a field guarded by the lock held meanwhile).
class AddsElapsed {
 public:
  explicit AddsElapsed(double& sum) : sum_(sum), started_(absl::Now()) {}
  ~AddsElapsed() { sum_ += absl::ToDoubleSeconds(absl::Now() - started_); }
  AddsElapsed(const AddsElapsed&) = delete;
  AddsElapsed& operator=(const AddsElapsed&) = delete;

 private:
  double& sum_;
  const absl::Time started_;
};

// The slice's last push buffer when this is its only holder, else a new one (kept for the
// next push).
std::shared_ptr<Bytes> ReusablePushBytes(SliceRt& rt) {
  if (rt.push_bytes && rt.push_bytes.use_count() == 1) {
    // Whoever held it last (the transport's I/O thread, after sending) released it: see its
    // reads as done before this thread overwrites the bytes.
    std::atomic_thread_fence(std::memory_order_acquire);
    return rt.push_bytes;
  }
  rt.push_bytes = std::make_shared<Bytes>();
  return rt.push_bytes;
}

}  // namespace

absl::Status UploadReplica(Tensor& t, size_t i) {
  SliceRt& rt = t.slices[i];
  if (rt.device_replica == nullptr) return absl::OkStatus();
  return t.device->ToDevice(rt.device_replica->data(), rt.replica.data(),
                            rt.replica.size() * sizeof(float));
}

void MeasureResidue(Tensor& t, bool now_anyway) {
  const absl::Time now = absl::Now();
  if (!now_anyway && (t.device != nullptr || now - t.residue_measured < absl::Seconds(1))) {
    return;
  }
  t.residue_measured = now;
  double sq = 0.0;
  for (const SliceRt& rt : t.slices) {
    absl::Span<const float> r;
    if (rt.device_residue != nullptr) {
      t.host_staging.resize(rt.device_residue->size());
      if (!rt.device_residue->Download(absl::MakeSpan(t.host_staging)).ok()) return;
      r = t.host_staging;
    } else if (rt.residue != nullptr) {
      r = rt.residue->residue();
    }
    for (float v : r) sq += static_cast<double>(v) * v;
  }
  t.residue_sq.store(sq, std::memory_order_relaxed);
}

absl::Status EncodeAllPending(SliceState& residue, absl::Span<const float> grad,
                              IndexCoding coding, Bytes* bytes) {
  std::vector<float> all(grad.size());
  const absl::Span<const float> r = residue.residue();
  for (size_t i = 0; i < grad.size(); ++i) all[i] = r[i] + grad[i];
  ADAPS_RETURN_IF_ERROR(EncodeDense(all, coding, bytes));
  absl::Span<float> next = residue.spare_residue();
  std::fill(next.begin(), next.end(), 0.0f);
  residue.set_pending();
  return absl::OkStatus();
}

void SentElements::Add(const CompressedUpdate* update, const SliceInfo& info) {
  if (update == nullptr || update->kind == CompressorKind::kDense ||
      update->kind == CompressorKind::kSign) {
    all = true;
    indices.clear();
  }
  if (all) return;
  const uint32_t at = static_cast<uint32_t>(info.offset);
  for (uint32_t idx : update->indices) indices.push_back(at + idx);
}

absl::StatusOr<std::vector<SharedBytes>> EncodePush(Tensor& t, absl::Span<const float> grad,
                                                    IndexCoding coding, bool flush) {
  AddsElapsed timer(t.traffic.compress_seconds);
  std::vector<SharedBytes> encoded;
  encoded.reserve(t.slices.size());
  absl::Status status;
  SentElements& sent = t.sent_scratch;
  sent.Clear();
  for (size_t i = 0; i < t.slices.size() && status.ok(); ++i) {
    const SliceInfo& info = t.meta[i].info;
    std::shared_ptr<Bytes> bytes = ReusablePushBytes(t.slices[i]);
    status =
        EncodeSlice(t, i, grad.subspan(info.offset, info.length), coding, flush, bytes.get());
    const bool compressed =
        (t.slices[i].residue != nullptr || t.slices[i].device_residue != nullptr) && !flush;
    if (status.ok()) sent.Add(compressed ? &t.update : nullptr, info);
    t.metrics.AddSent(compressed ? t.update.SentElements() : info.length);
    if (!status.ok()) {
      status = absl::Status(status.code(),
                            absl::StrCat("gradient of '", t.spec.name, "' (slice at ",
                                         info.offset, "): ", status.message()));
    }
    encoded.push_back(std::move(bytes));
  }
  const bool ok = status.ok();
  for (SliceRt& rt : t.slices) {
    // (Only a device can fail here, and then it is broken: its error is the push's.)
    absl::Status ended = EndPush(rt, ok, flush);
    if (status.ok()) status = std::move(ended);
  }
  if (!status.ok()) return status;
  std::swap(t.last_sent, sent);
  MeasureResidue(t, flush);
  return encoded;
}

namespace {

// Slice `i` of a pull answer into host memory at `dst` (the slice's first element).
absl::Status ApplyHostPull(Tensor& t, size_t i, const msg::PullResponse& resp,
                           absl::Span<const uint8_t> payload, float* dst,
                           const Bytes* own_push) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
  const SliceInfo& info = t.meta[i].info;
  SliceRt& rt = t.slices[i];
  // TensorSpec::pull_in_place: the output is the replica, nothing to copy between them.
  const bool in_place = rt.replica.data() == dst;
  const bool sparse = t.spec.pull == PullFormat::kSparse;
  if (resp.format() == msg::PullFormat::Dense) {
    if (payload.size() != uint64_t{info.length} * sizeof(float)) {
      return absl::DataLossError("dense pull of the wrong size");
    }
    std::memcpy(dst, payload.data(), payload.size());
    if (sparse) {  // the server chose dense: the replica the next sparse answers change
      if (!in_place) std::memcpy(rt.replica.data(), payload.data(), payload.size());
      rt.replica_version = resp.version();
      ++t.traffic.pulls_answered_dense;
    }
    return absl::OkStatus();
  }
  const bool forwarded = resp.format() == msg::PullFormat::Forwarded;
  if (sparse != (resp.format() == msg::PullFormat::Sparse || forwarded)) {
    return absl::DataLossError(absl::StrCat("pull of '", t.spec.name, "' answered in format ",
                                            msg::EnumNamePullFormat(resp.format())));
  }
  if (sparse) {
    if (payload.empty()) {  // nothing new since the replica's version
      if (resp.version() != rt.replica_version) {
        return absl::DataLossError(absl::StrCat("empty sparse pull at version ",
                                                resp.version(), " but replica is at ",
                                                rt.replica_version));
      }
      if (!in_place) std::memcpy(dst, rt.replica.data(), rt.replica.size() * sizeof(float));
      return absl::OkStatus();
    }
    if (!resp.zero_base() && resp.base_version() != rt.replica_version) {
      return absl::DataLossError(absl::StrCat("sparse pull from version ", resp.base_version(),
                                              " but replica is at ", rt.replica_version));
    }
    // replica = the answer's values at its elements (the rest kept, or 0 for a mean), or
    // the mean replayed from the forwarded pushes (a whole mean: zero_base), or the SGD step
    // replayed on the replica at the version before; and the output = replica (no copy when
    // the output is the replica: pull_in_place); nothing changes if the answer is damaged.
    const absl::Span<const uint8_t> own =
        own_push != nullptr ? absl::MakeConstSpan(*own_push) : absl::Span<const uint8_t>();
    const absl::Span<const uint8_t>* held = own_push != nullptr ? &own : nullptr;
    const absl::Span<float> out_slice = absl::MakeSpan(dst, rt.replica.size());
    absl::Status st =
        !forwarded        ? DecodeAssignCopy(payload, resp.zero_base(),
                                             absl::MakeSpan(rt.replica), out_slice)
        : resp.zero_base() ? DecodeForwardedCopy(payload, absl::MakeSpan(rt.replica), out_slice,
                                                 held)
                           : DecodeForwardedSgdCopy(payload, absl::MakeSpan(rt.replica),
                                                    out_slice, held);
    if (!st.ok()) {
      return absl::DataLossError(
          absl::StrCat("sparse pull of '", t.spec.name, "': ", st.message()));
    }
    rt.replica_version = resp.version();
    ++(forwarded ? t.traffic.pulls_answered_forwarded : t.traffic.pulls_answered_sparse);
    return absl::OkStatus();
  }
  if (resp.base_version() != rt.replica_version) {
    return absl::DataLossError(absl::StrCat("recompressed pull from version ",
                                            resp.base_version(), " but replica is at ",
                                            rt.replica_version));
  }
  if (!payload.empty()) {
    // replica += update and the parameters = replica, in one pass
    ADAPS_RETURN_IF_ERROR(DecodeAddCopy(payload, 1.0f, absl::MakeSpan(rt.replica),
                                        absl::MakeSpan(dst, rt.replica.size())));
  } else if (!in_place) {
    std::memcpy(dst, rt.replica.data(), rt.replica.size() * sizeof(float));
  }
  rt.replica_version = resp.version();
  return absl::OkStatus();
}

// ApplyPull's answer for a tensor on a device (`dst` in device memory): a dense answer is
// copied once into `dst`; a recompressed one is decoded on the host, added to the host
// replica and, on the device, to the device's copy of it, which is then copied into `dst`
// (the same float additions on both: the copies stay equal). A sparse one (the new values at
// a few elements, or pushes to replay) changes the host replica as for a tensor in host
// memory, which is then copied whole into `dst`: the copy of a dense pull.
absl::Status ApplyDevicePull(Tensor& t, size_t i, const msg::PullResponse& resp,
                             absl::Span<const uint8_t> payload, float* dst,
                             const Bytes* own_push) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
  const SliceInfo& info = t.meta[i].info;
  SliceRt& rt = t.slices[i];
  const size_t bytes = uint64_t{info.length} * sizeof(float);
  if (t.spec.pull == PullFormat::kSparse) {
    ADAPS_RETURN_IF_ERROR(ApplyHostPull(t, i, resp, payload, rt.replica.data(), own_push));
    return t.device->ToDevice(dst, rt.replica.data(), bytes);
  }
  if (resp.format() == msg::PullFormat::Dense) {
    if (payload.size() != bytes) return absl::DataLossError("dense pull of the wrong size");
    return t.device->ToDevice(dst, payload.data(), bytes);
  }
  if (resp.format() != msg::PullFormat::Recompressed || rt.device_replica == nullptr) {
    return absl::DataLossError(absl::StrCat("pull of '", t.spec.name, "' (on ",
                                            t.device->name(), ") answered in format ",
                                            msg::EnumNamePullFormat(resp.format())));
  }
  if (resp.base_version() != rt.replica_version) {
    return absl::DataLossError(absl::StrCat("recompressed pull from version ",
                                            resp.base_version(), " but replica is at ",
                                            rt.replica_version));
  }
  if (!payload.empty()) {
    CompressedUpdate& u = t.pull_update;
    if (absl::Status st = DecodeUpdate(payload, &u); !st.ok()) {
      return absl::DataLossError(
          absl::StrCat("recompressed pull of '", t.spec.name, "': ", st.message()));
    }
    if (absl::Status st = DecompressAdd(u, 1.0f, absl::MakeSpan(rt.replica)); !st.ok()) {
      return absl::DataLossError(
          absl::StrCat("recompressed pull of '", t.spec.name, "': ", st.message()));
    }
    ADAPS_RETURN_IF_ERROR(t.device_codec->AddUpdate(u, rt.device_replica->data(), info.length));
  }
  ADAPS_RETURN_IF_ERROR(t.device->Copy(dst, rt.device_replica->data(), bytes));
  rt.replica_version = resp.version();
  return absl::OkStatus();
}

absl::Status ApplyPullLocked(Tensor& t, size_t i, const msg::PullResponse& resp,
                             absl::Span<const uint8_t> payload, uint64_t wire_bytes,
                             absl::Span<float> out, const Bytes* own_push)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
  AddsElapsed timer(t.traffic.decode_seconds);
  const SliceInfo& info = t.meta[i].info;
  t.traffic.pull_wire_bytes += wire_bytes;
  t.traffic.pull_dense_bytes += uint64_t{info.length} * sizeof(float);
  t.traffic.server_seconds += static_cast<double>(resp.server_us()) * 1e-6;
  t.metrics.Sync(t.traffic);
  float* dst = out.data() + info.offset;
  if (t.device != nullptr) return ApplyDevicePull(t, i, resp, payload, dst, own_push);
  return ApplyHostPull(t, i, resp, payload, dst, own_push);
}

}  // namespace

absl::Status ApplyPull(Tensor& t, size_t i, const msg::PullResponse& resp,
                       absl::Span<const uint8_t> payload, uint64_t wire_bytes,
                       absl::Span<float> out, const Bytes* own_push) {
  absl::MutexLock lock(&t.mu);
  absl::Status st = ApplyPullLocked(t, i, resp, payload, wire_bytes, out, own_push);
  if (st.ok()) t.slices[i].seen_version = std::max(t.slices[i].seen_version, resp.version());
  return st;
}

const char* RunStageName(RunStage stage) {
  switch (stage) {
    case RunStage::kQueued:
      return "queued";
    case RunStage::kPrepared:
      return "prepared";
    case RunStage::kSent:
      return "sent";
    case RunStage::kRetrying:
      return "retrying";
    case RunStage::kDecided:
      return "decided";
    case RunStage::kSettled:
      return "settled";
  }
  return "unknown";
}

void RunOp::Advance(RunStage to) {
  if (Decided()) return;
  const bool in_order = (stage_ == RunStage::kQueued && to == RunStage::kPrepared) ||
                        (stage_ == RunStage::kPrepared && to == RunStage::kSent) ||
                        (stage_ == RunStage::kSent && to == RunStage::kRetrying) ||
                        // sent again: a retried attempt, or one slice's early retry
                        ((stage_ == RunStage::kRetrying || stage_ == RunStage::kSent) &&
                         to == RunStage::kSent);
  ADAPS_DCHECK(in_order, absl::StrCat("a Run's stage moved out of order: ", RunStageName(stage_),
                                      " to ", RunStageName(to), " (worker/tensor.h, RunStage)")
                             .c_str());
  stage_ = to;
}

void RunOp::Settle(const absl::Status& status) {
  if (Decided()) return;
  if (writing_ > 0) {
    stage_ = RunStage::kDecided;
    outcome_ = status;
  } else {
    SetPromise(status);
  }
}

bool RunOp::BeginWrite() {
  if (Decided()) return false;
  ++writing_;
  return true;
}

void RunOp::EndWrite() {
  if (--writing_ == 0 && stage_ == RunStage::kDecided) SetPromise(outcome_);
}

void RunOp::SetPromise(const absl::Status& status) {
  stage_ = RunStage::kSettled;
  promise.set_value(status);
  if (on_done) on_done(status);
}

}  // namespace adaps
