#include "common/compressor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace adaps {
namespace {

absl::Status CheckLengths(absl::Span<const float> grad, const SliceState& state) {
  if (grad.size() != state.size()) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has ", grad.size(),
                                                   " elements but the slice has ", state.size()));
  }
  if (grad.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice of ", grad.size(), " elements is longer than 2^32-1"));
  }
  return absl::OkStatus();
}

// Step 1 of docs/algorithm.md. Returns OK with `*send_nothing` set under kSendNothing.
absl::Status CheckFinite(absl::Span<const float> grad, NonFinitePolicy policy,
                         bool* send_nothing) {
  *send_nothing = false;
  if (AllFinite(grad)) return absl::OkStatus();
  if (policy == NonFinitePolicy::kSendNothing) {
    *send_nothing = true;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("gradient holds NaN or Inf; residue left unchanged");
}

void AddInPlace(absl::Span<const float> grad, absl::Span<float> residue) {
  float* r = residue.data();
  const float* g = grad.data();
  const size_t n = grad.size();
  for (size_t i = 0; i < n; ++i) r[i] += g[i];
}

// out = in + grad in one pass; false when a sum is NaN or +-Inf (out then holds garbage).
// The check is an integer OR over the exponent bits, so the loop vectorises.
bool AddInto(absl::Span<const float> grad, absl::Span<const float> in, absl::Span<float> out) {
  const float* g = grad.data();
  const float* r = in.data();
  float* o = out.data();
  const size_t n = grad.size();
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = r[i] + g[i];
    o[i] = v;
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// After a single pass found a non-finite residue + gradient: a bad gradient (OK under
// kSendNothing, the caller's `out` being the empty update) or a float overflow.
absl::Status NonFiniteError(absl::Span<const float> grad, NonFinitePolicy policy,
                            const char* codec) {
  if (!AllFinite(grad)) {
    if (policy == NonFinitePolicy::kSendNothing) return absl::OkStatus();
    return absl::InvalidArgumentError("gradient holds NaN or Inf; residue left unchanged");
  }
  return absl::OutOfRangeError(absl::StrCat(
      codec, " residue + gradient overflows the float range; residue left unchanged"));
}

// Where a Top-k or sign step finds residue + gradient. Single call: in place after a
// pre-scan (the residue is the only buffer). Two phases: into the spare buffer, checked in
// the same pass. `*r` is empty when there is nothing to do (send nothing, or an error).
absl::Status SumResidue(absl::Span<const float> grad, SliceState& state, bool pending,
                        NonFinitePolicy policy, const char* codec, absl::Span<float>* r) {
  *r = absl::Span<float>();
  if (!pending) {
    bool nothing = false;
    ADAPS_RETURN_IF_ERROR(CheckFinite(grad, policy, &nothing));
    if (nothing || grad.empty()) return absl::OkStatus();
    AddInPlace(grad, state.residue());
    *r = state.residue();
    return absl::OkStatus();
  }
  if (grad.empty()) return absl::OkStatus();
  absl::Span<float> spare = state.spare_residue();
  if (!AddInto(grad, state.residue(), spare)) return NonFiniteError(grad, policy, codec);
  *r = spare;
  return absl::OkStatus();
}

// The compressors with error feedback: one step in two phases or one (docs/algorithm.md;
// CompressPending leaves the new residue pending until the caller commits or discards it).
class ResidueCompressor : public Compressor {
 public:
  explicit ResidueCompressor(const CompressorOptions& options) : options_(options) {}
  const CompressorOptions& options() const final { return options_; }

  absl::Status Compress(absl::Span<const float> grad, SliceState& state,
                        CompressedUpdate& out) final {
    return Step(grad, state, out, /*pending=*/false);
  }
  absl::Status CompressPending(absl::Span<const float> grad, SliceState& state,
                               CompressedUpdate& out) final {
    return Step(grad, state, out, /*pending=*/true);
  }

 protected:
  virtual absl::Status Step(absl::Span<const float> grad, SliceState& state,
                            CompressedUpdate& out, bool pending) = 0;

  const CompressorOptions options_;
};

// Top-k and sign: residue + gradient summed into one buffer (SumResidue), then a pick that
// writes the update and leaves the error in that buffer.
class SumThenPickCompressor : public ResidueCompressor {
 protected:
  SumThenPickCompressor(const CompressorOptions& options, CompressorKind kind, const char* name)
      : ResidueCompressor(options), kind_(kind), name_(name) {}

  // The update's fields before the sum (what an empty step sends).
  virtual void Begin(CompressedUpdate& out) { (void)out; }
  virtual void Pick(absl::Span<float> r, CompressedUpdate& out) = 0;

 private:
  absl::Status Step(absl::Span<const float> grad, SliceState& state, CompressedUpdate& out,
                    bool pending) final {
    ADAPS_RETURN_IF_ERROR(CheckLengths(grad, state));
    state.Discard();
    out.Clear();
    out.kind = kind_;
    out.length = static_cast<uint32_t>(grad.size());
    Begin(out);
    absl::Span<float> r;
    ADAPS_RETURN_IF_ERROR(SumResidue(grad, state, pending, options_.non_finite, name_, &r));
    if (r.empty()) return absl::OkStatus();
    Pick(r, out);
    if (pending) state.set_pending();
    return absl::OkStatus();
  }

  const CompressorKind kind_;
  const char* const name_;
};

class DenseCompressor final : public Compressor {
 public:
  explicit DenseCompressor(const CompressorOptions& options) : options_(options) {}
  const CompressorOptions& options() const override { return options_; }

  absl::Status Compress(absl::Span<const float> grad, SliceState& state,
                        CompressedUpdate& out) override {
    ADAPS_RETURN_IF_ERROR(CheckLengths(grad, state));
    state.Discard();
    bool nothing = false;
    ADAPS_RETURN_IF_ERROR(CheckFinite(grad, options_.non_finite, &nothing));
    out.Clear();
    out.kind = CompressorKind::kDense;
    out.length = static_cast<uint32_t>(grad.size());
    if (nothing) {
      out.values.assign(grad.size(), 0.0f);
    } else {
      out.values.assign(grad.begin(), grad.end());
    }
    return absl::OkStatus();
  }

  // No residue: the one phase is the whole step.
  absl::Status CompressPending(absl::Span<const float> grad, SliceState& state,
                               CompressedUpdate& out) override {
    return Compress(grad, state, out);
  }

 private:
  CompressorOptions options_;
};

// No pre-scan: the pass reads the active residue and writes the new one into the spare
// buffer, finding any NaN/Inf of residue + gradient as it goes. Only a successful step
// swaps the buffers (or, two-phase, marks the spare one pending), so on every error the
// residue is bit-for-bit what it was.
class AdaCompCompressor final : public ResidueCompressor {
 public:
  explicit AdaCompCompressor(const CompressorOptions& options) : ResidueCompressor(options) {}

 private:
  absl::Status Step(absl::Span<const float> grad, SliceState& state, CompressedUpdate& out,
                    bool pending) override {
    ADAPS_RETURN_IF_ERROR(CheckLengths(grad, state));
    state.Discard();
    const absl::Span<float> next = state.spare_residue();
    if (internal::AdaCompStep(grad, state.residue(), next, options_.bin_size, gmax_, out)) {
      if (pending) {
        state.set_pending();
      } else {
        state.swap_residue();
      }
      return absl::OkStatus();
    }
    // Rare path: `out` is an empty update; tell a bad gradient from an overflow.
    return NonFiniteError(grad, options_.non_finite, "AdaComp");
  }

  std::vector<float> gmax_;
};

class TopKCompressor final : public SumThenPickCompressor {
 public:
  explicit TopKCompressor(const CompressorOptions& options)
      : SumThenPickCompressor(options, CompressorKind::kTopK, "Top-k") {}

 private:
  // Sends the k largest magnitudes of `r` (residue + gradient) and zeroes them in `r`.
  void Pick(absl::Span<float> r, CompressedUpdate& out) override {
    const size_t n = r.size();
    size_t k = static_cast<size_t>(std::llround(options_.topk_fraction * static_cast<double>(n)));
    k = std::clamp<size_t>(k, 1, n);

    // Exact k: the k-th largest magnitude is the threshold; everything above it is sent,
    // then ties at the threshold in index order until k are chosen.
    mags_.resize(n);
    for (size_t i = 0; i < n; ++i) mags_[i] = std::fabs(r[i]);
    std::nth_element(mags_.begin(), mags_.begin() + (n - k), mags_.end());
    const float threshold = mags_[n - k];
    size_t above = 0;
    for (size_t i = n - k + 1; i < n; ++i) above += mags_[i] > threshold ? 1 : 0;
    size_t ties_left = k - above;

    out.indices.reserve(k);
    out.values.reserve(k);
    for (size_t i = 0; i < n; ++i) {
      const float m = std::fabs(r[i]);
      if (m == 0.0f) continue;  // a zero is never sent (fewer than k nonzero: all of them)
      if (m > threshold || (m == threshold && ties_left > 0)) {
        if (m == threshold) --ties_left;
        out.indices.push_back(static_cast<uint32_t>(i));
        out.values.push_back(r[i]);
        r[i] = 0.0f;
      }
    }
  }

  std::vector<float> mags_;
};

class SignCompressor final : public SumThenPickCompressor {
 public:
  explicit SignCompressor(const CompressorOptions& options)
      : SumThenPickCompressor(options, CompressorKind::kSign, "sign") {}

 private:
  void Begin(CompressedUpdate& out) override { out.sign_bits.assign((out.length + 63) / 64, 0); }

  // One bit per element of `r` (residue + gradient), two scales; `r` keeps the error.
  void Pick(absl::Span<float> r, CompressedUpdate& out) override {
    const size_t n = r.size();
    double pos_sum = 0.0, neg_sum = 0.0;
    size_t pos_count = 0;
    for (size_t i = 0; i < n; ++i) {
      if (r[i] >= 0.0f) {
        pos_sum += r[i];
        ++pos_count;
      } else {
        neg_sum += r[i];
        out.sign_bits[i / 64] |= uint64_t{1} << (i % 64);
      }
    }
    const size_t neg_count = n - pos_count;
    out.scale = pos_count ? static_cast<float>(pos_sum / static_cast<double>(pos_count)) : 0.0f;
    out.scale_neg = neg_count ? static_cast<float>(neg_sum / static_cast<double>(neg_count)) : 0.0f;
    for (size_t i = 0; i < n; ++i) {
      const bool neg = (out.sign_bits[i / 64] >> (i % 64)) & 1;
      r[i] -= neg ? out.scale_neg : out.scale;
    }
  }
};

}  // namespace

namespace internal {

namespace {
constexpr size_t kHugeBytes = size_t{4} << 20;
constexpr size_t kHugeAlign = size_t{2} << 20;
}  // namespace

void* AllocateResidue(size_t bytes) {
  if (bytes < kHugeBytes) return ::operator new(bytes, std::align_val_t{64});
  const size_t rounded = (bytes + kHugeAlign - 1) & ~(kHugeAlign - 1);
  void* p = ::operator new(rounded, std::align_val_t{kHugeAlign});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
  return p;
}

void FreeResidue(void* p, size_t bytes) {
  if (bytes < kHugeBytes) {
    ::operator delete(p, std::align_val_t{64});
  } else {
    ::operator delete(p, std::align_val_t{kHugeAlign});
  }
}

}  // namespace internal

const char* CompressorKindName(CompressorKind kind) {
  switch (kind) {
    case CompressorKind::kDense:
      return "dense";
    case CompressorKind::kAdaComp:
      return "adacomp";
    case CompressorKind::kTopK:
      return "topk";
    case CompressorKind::kSign:
      return "sign";
  }
  return "unknown";
}

absl::StatusOr<CompressorKind> ParseCompressorKind(const std::string& name) {
  for (CompressorKind k : {CompressorKind::kDense, CompressorKind::kAdaComp,
                           CompressorKind::kTopK, CompressorKind::kSign}) {
    if (name == CompressorKindName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown compressor '", name, "' (expected dense, adacomp, topk or sign)"));
}

absl::Status ValidateOptions(const CompressorOptions& options) {
  switch (options.kind) {
    case CompressorKind::kDense:
    case CompressorKind::kAdaComp:
    case CompressorKind::kTopK:
    case CompressorKind::kSign:
      break;
    default:
      return absl::InvalidArgumentError("unknown compressor kind");
  }
  if (options.kind == CompressorKind::kAdaComp && options.bin_size == 0) {
    return absl::InvalidArgumentError("AdaComp bin size must be at least 1");
  }
  if (options.kind == CompressorKind::kTopK &&
      !(options.topk_fraction > 0.0 && options.topk_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Top-k fraction must be in (0, 1], got ", options.topk_fraction));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Compressor>> MakeCompressor(const CompressorOptions& options) {
  ADAPS_RETURN_IF_ERROR(ValidateOptions(options));
  switch (options.kind) {
    case CompressorKind::kDense:
      return std::unique_ptr<Compressor>(new DenseCompressor(options));
    case CompressorKind::kAdaComp:
      return std::unique_ptr<Compressor>(new AdaCompCompressor(options));
    case CompressorKind::kTopK:
      return std::unique_ptr<Compressor>(new TopKCompressor(options));
    case CompressorKind::kSign:
      return std::unique_ptr<Compressor>(new SignCompressor(options));
  }
  return absl::InvalidArgumentError("unknown compressor kind");
}

size_t CompressedUpdate::SentElements() const {
  switch (kind) {
    case CompressorKind::kDense:
    case CompressorKind::kSign:
      return length;
    case CompressorKind::kAdaComp:
    case CompressorKind::kTopK:
      return indices.size();
  }
  return 0;
}

void CompressedUpdate::Clear() {
  length = 0;
  bin_size = 0;
  scale = 0.0f;
  scale_neg = 0.0f;
  indices.clear();
  negative.clear();
  values.clear();
  sign_bits.clear();
}

absl::Status ValidateUpdate(const CompressedUpdate& u) {
  auto check_indices = [&]() -> absl::Status {
    int64_t prev = -1;
    for (uint32_t i : u.indices) {
      if (static_cast<int64_t>(i) <= prev || i >= u.length) {
        return absl::InvalidArgumentError(
            absl::StrCat("update index ", i, " out of order or out of range ", u.length));
      }
      prev = i;
    }
    return absl::OkStatus();
  };
  switch (u.kind) {
    case CompressorKind::kDense:
      if (u.values.size() != u.length) return absl::InvalidArgumentError("dense size mismatch");
      return absl::OkStatus();
    case CompressorKind::kAdaComp:
      if (u.negative.size() != u.indices.size()) {
        return absl::InvalidArgumentError("AdaComp update has mismatched indices and signs");
      }
      return check_indices();
    case CompressorKind::kTopK:
      if (u.values.size() != u.indices.size()) {
        return absl::InvalidArgumentError("Top-k update has mismatched indices and values");
      }
      return check_indices();
    case CompressorKind::kSign:
      if (u.sign_bits.size() != (static_cast<size_t>(u.length) + 63) / 64) {
        return absl::InvalidArgumentError("sign update has the wrong number of sign words");
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown compressor kind");
}

absl::Status DecompressAdd(const CompressedUpdate& u, float factor, absl::Span<float> dst) {
  if (dst.size() != u.length) {
    return absl::InvalidArgumentError(absl::StrCat("update is for ", u.length,
                                                   " elements, buffer has ", dst.size()));
  }
  ADAPS_RETURN_IF_ERROR(ValidateUpdate(u));
  float* d = dst.data();
  switch (u.kind) {
    case CompressorKind::kDense:
      for (size_t i = 0; i < u.length; ++i) d[i] += factor * u.values[i];
      return absl::OkStatus();
    case CompressorKind::kAdaComp: {
      const float pos = factor * u.scale;
      for (size_t j = 0; j < u.indices.size(); ++j) d[u.indices[j]] += u.negative[j] ? -pos : pos;
      return absl::OkStatus();
    }
    case CompressorKind::kTopK:
      for (size_t j = 0; j < u.indices.size(); ++j) d[u.indices[j]] += factor * u.values[j];
      return absl::OkStatus();
    case CompressorKind::kSign: {
      const float pos = factor * u.scale, neg = factor * u.scale_neg;
      for (size_t i = 0; i < u.length; ++i) {
        d[i] += ((u.sign_bits[i / 64] >> (i % 64)) & 1) ? neg : pos;
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("unknown compressor kind");
}

}  // namespace adaps
