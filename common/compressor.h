// Gradient compressors: AdaComp (the algorithm of docs/algorithm.md), and the baselines
// users compare it with: dense fp32, Top-k with error feedback, 1-bit sign with error
// feedback (Seide et al. 2014).
//
// Ownership: the caller owns one `SliceState` (the residue) per tensor slice and passes it
// to every `Compress` call for that slice; a `Compressor` holds only scratch space and its
// options. Thread-safety: a `Compressor` is thread-compatible (one per thread, or guarded);
// distinct `SliceState`s may be used from distinct threads with distinct compressors.
// Failure: `Compress` returns a non-OK status and leaves the residue bit-for-bit unchanged.
#ifndef ADAPS_COMMON_COMPRESSOR_H_
#define ADAPS_COMMON_COMPRESSOR_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace adaps {

enum class CompressorKind : uint8_t {
  kDense = 0,
  kAdaComp = 1,
  kTopK = 2,
  kSign = 3,
};

// "dense", "adacomp", "topk", "sign".
const char* CompressorKindName(CompressorKind kind);
// Parses the names above; kInvalidArgument otherwise.
absl::StatusOr<CompressorKind> ParseCompressorKind(const std::string& name);

// What to do when a gradient holds NaN or +-Inf (docs/algorithm.md, step 1).
enum class NonFinitePolicy : uint8_t {
  kReject = 0,     // return kInvalidArgument
  kSendNothing = 1 // return OK with an empty update (nothing sent, residue untouched)
};

struct CompressorOptions {
  CompressorKind kind = CompressorKind::kAdaComp;
  // AdaComp bin size T: ~50 for convolutional layers, ~500 for fully-connected/recurrent.
  uint32_t bin_size = 500;
  // Top-k: fraction of the slice sent each step; k = max(1, round(fraction * N)), of which
  // only the nonzero ones are sent (1: every nonzero element, exactly: a row-sparse gradient
  // at its own size).
  double topk_fraction = 0.001;
  NonFinitePolicy non_finite = NonFinitePolicy::kReject;
};

namespace internal {
// Residue buffers: 64-byte (cache-line) aligned, for the SIMD kernels that stream through them;
// from 4 MiB on, 2 MiB aligned and (Linux) advised to use transparent huge pages, which cuts
// the TLB misses of the sparse fix-up. Defined in compressor.cc.
void* AllocateResidue(size_t bytes);
void FreeResidue(void* p, size_t bytes);

template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) { return static_cast<T*>(AllocateResidue(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { FreeResidue(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const { return false; }
};
}  // namespace internal

// kInvalidArgument when the options cannot describe a compressor (bin size 0, fraction
// outside (0, 1]).
absl::Status ValidateOptions(const CompressorOptions& options);

// The residue of one slice. Starts at zero. Owned by the caller.
//
// Memory: AdaComp keeps the residue double-buffered, so an AdaComp slice costs 2 x 4 B per
// element (the second buffer is allocated by the first AdaComp Compress). Top-k, sign and dense
// slices keep 4 B per element unless they are compressed in two phases (CompressPending), which
// allocates the second buffer for them too. The AdaComp pass reads the active buffer and
// writes the new residue into the other one, and swaps only when the step succeeded: a
// NaN/Inf gradient (or an overflow) is found during the pass and leaves the active residue
// bit-for-bit untouched without a separate pre-scan of the gradient. A span from residue()
// refers to the buffer that was active when it was taken; take it again after a Compress or a
// Commit.
//
// Two phases: after a successful Compressor::CompressPending the new residue waits in the
// spare buffer (pending() is true) and residue() is still the old one; Commit() makes the
// pending residue the active one, Discard() drops it. Any Compress or CompressPending on the
// state replaces a residue still pending.
class SliceState {
 public:
  explicit SliceState(size_t length) : size_(length) { buffers_[0].assign(length, 0.0f); }
  size_t size() const { return size_; }
  absl::Span<float> residue() { return absl::MakeSpan(buffers_[active_].data(), size_); }
  absl::Span<const float> residue() const {
    return absl::MakeConstSpan(buffers_[active_].data(), size_);
  }
  void Reset() {
    std::fill(buffers_[active_].begin(), buffers_[active_].end(), 0.0f);
    pending_ = false;
  }

  // Whether a residue from CompressPending waits for Commit or Discard.
  bool pending() const { return pending_; }
  // Makes the pending residue the active one; no-op when none is pending.
  void Commit() {
    if (pending_) active_ ^= 1;
    pending_ = false;
  }
  // Drops the pending residue (the active one stays as it was); no-op when none is pending.
  void Discard() { pending_ = false; }

  // For compressors: the inactive buffer (allocated on first use; contents unspecified),
  // making it the active one, and marking it pending instead.
  absl::Span<float> spare_residue() {
    std::vector<float, internal::AlignedAllocator<float>>& b = buffers_[active_ ^ 1];
    if (b.size() != size_) b.assign(size_, 0.0f);
    return absl::MakeSpan(b.data(), size_);
  }
  void swap_residue() {
    active_ ^= 1;
    pending_ = false;
  }
  void set_pending() { pending_ = true; }

 private:
  size_t size_;
  unsigned active_ = 0;
  bool pending_ = false;
  std::vector<float, internal::AlignedAllocator<float>> buffers_[2];  // 64-byte aligned
};

// One compressed update of one slice, in memory. Which fields are used depends on `kind`:
//   kDense:   values (length of them).
//   kAdaComp: bin_size, scale, indices (ascending), negative (one 0/1 byte per index);
//             element indices[j] has value (negative[j] ? -scale : scale).
//   kTopK:    indices (ascending), values (one per index).
//   kSign:    sign_bits (bit i of word i/64 set when element i is negative),
//             scale (value of non-negative elements), scale_neg (value of negative ones).
struct CompressedUpdate {
  CompressorKind kind = CompressorKind::kDense;
  uint32_t length = 0;
  uint32_t bin_size = 0;
  float scale = 0.0f;
  float scale_neg = 0.0f;
  std::vector<uint32_t> indices;
  std::vector<uint8_t> negative;
  std::vector<float> values;
  std::vector<uint64_t> sign_bits;

  // Number of elements that carry information: length for dense and sign, else the count.
  size_t SentElements() const;
  // Empties the update, keeping capacity.
  void Clear();
};

class Compressor {
 public:
  virtual ~Compressor() = default;
  virtual const CompressorOptions& options() const = 0;

  // Compresses `grad` for the slice whose residue is `state`, writing the update to `out`
  // (previous contents replaced). Errors: kInvalidArgument when sizes differ or the slice
  // is longer than 2^32-1, or (policy kReject) when `grad` holds NaN/Inf; the residue is
  // unchanged on any error.
  virtual absl::Status Compress(absl::Span<const float> grad, SliceState& state,
                                CompressedUpdate& out) = 0;

  // The first phase of a two-phase step over several slices: like Compress, but on success
  // the new residue is left pending in `state` (state.Commit() applies it, state.Discard()
  // drops it), so a caller can commit every slice only when all of them compressed. Finds
  // NaN/Inf (kInvalidArgument under kReject) and a float overflow of residue + gradient
  // (kOutOfRange) in its single pass, without a pre-scan; on any error nothing is pending and
  // the residue is unchanged. Dense has no residue: nothing is ever pending.
  virtual absl::Status CompressPending(absl::Span<const float> grad, SliceState& state,
                                       CompressedUpdate& out) = 0;
};

// kInvalidArgument for invalid options.
absl::StatusOr<std::unique_ptr<Compressor>> MakeCompressor(const CompressorOptions& options);

// kInvalidArgument when the fields `update.kind` uses disagree: value/sign counts against
// the indices or the length, or indices not strictly ascending below the length. The one
// consistency check of an in-memory update, shared by every decompressor and the encoder.
absl::Status ValidateUpdate(const CompressedUpdate& update);

// dst += factor * decompress(update). kInvalidArgument when dst.size() != update.length or
// the update is malformed (index out of range, sizes inconsistent); dst is unchanged then.
absl::Status DecompressAdd(const CompressedUpdate& update, float factor, absl::Span<float> dst);

// Returns true when every value is finite. Vectorised.
bool AllFinite(absl::Span<const float> values);

namespace internal {
// Which implementation of the AdaComp pass to run. kAuto: the best this CPU has. An ISA the
// CPU lacks runs the best one it has instead (tests check AdaCompIsaSupported first).
enum class AdaCompIsa : uint8_t { kAuto = 0, kPortable = 1, kAvx2 = 2, kAvx512 = 3 };
// How the new residue is stored. kAuto: non-temporal (streaming) stores for slices of 64k
// elements and more, normal stores below. The portable path always uses normal stores.
enum class AdaCompStores : uint8_t { kAuto = 0, kRegular = 1, kStreaming = 2 };

bool AdaCompIsaSupported(AdaCompIsa isa);
AdaCompIsa AdaCompBestIsa();
const char* AdaCompIsaName(AdaCompIsa isa);
// True when this CPU runs the AVX2 path (AVX2, BMI1, BMI2, POPCNT).
bool AdaCompHasAvx2();

// The AdaComp fast path (docs/algorithm.md), exposed for tests and benchmarks. Reads
// `residue_in` (never written) and `grad`, writes the new residue to `residue_out` and the
// update to `out`. All three have the same length; `residue_out` must not overlap the others.
// Returns false when residue_in + grad is NaN or +-Inf anywhere (a NaN/Inf in `grad`, or a
// float overflow): `out` is then an empty update and `residue_out` holds garbage.
// `gmax_scratch` is resized as needed.
bool AdaCompStep(absl::Span<const float> grad, absl::Span<const float> residue_in,
                 absl::Span<float> residue_out, uint32_t bin_size,
                 std::vector<float>& gmax_scratch, CompressedUpdate& out,
                 AdaCompIsa isa = AdaCompIsa::kAuto,
                 AdaCompStores stores = AdaCompStores::kAuto);

// AdaCompStep over the gradient grad[i] = params[i] - published[i] - residue_in[i] (that
// expression, evaluated left to right), computed block by block as the pass goes instead of
// being stored: one pass over params, published and the residue (the server's recompressed
// pulls: residue_in + grad is the change from the published state). Bit-identical to
// AdaCompStep over the stored gradient. `change_scratch` holds one block (a few KiB, resized
// on first use); false as AdaCompStep (NaN/Inf of the gradient or of residue_in + grad).
bool AdaCompChangeStep(absl::Span<const float> params, absl::Span<const float> published,
                       absl::Span<const float> residue_in, absl::Span<float> residue_out,
                       uint32_t bin_size, std::vector<float>& gmax_scratch,
                       std::vector<float>& change_scratch, CompressedUpdate& out,
                       AdaCompIsa isa = AdaCompIsa::kAuto,
                       AdaCompStores stores = AdaCompStores::kAuto);
}  // namespace internal

}  // namespace adaps

#endif  // ADAPS_COMMON_COMPRESSOR_H_
