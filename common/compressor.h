// Gradient compressors: AdaComp (the contract of DESIGN.md section 1), and the baselines
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

// What to do when a gradient holds NaN or +-Inf (DESIGN.md section 1, step 1).
enum class NonFinitePolicy : uint8_t {
  kReject = 0,     // return kInvalidArgument
  kSendNothing = 1 // return OK with an empty update (nothing sent, residue untouched)
};

struct CompressorOptions {
  CompressorKind kind = CompressorKind::kAdaComp;
  // AdaComp bin size T: ~50 for convolutional layers, ~500 for fully-connected/recurrent.
  uint32_t bin_size = 500;
  // Top-k: fraction of the slice sent each step; k = max(1, round(fraction * N)).
  double topk_fraction = 0.001;
  NonFinitePolicy non_finite = NonFinitePolicy::kReject;
};

// kInvalidArgument when the options cannot describe a compressor (bin size 0, fraction
// outside (0, 1]).
absl::Status ValidateOptions(const CompressorOptions& options);

// The residue of one slice. Starts at zero. Owned by the caller.
class SliceState {
 public:
  explicit SliceState(size_t length) : residue_(length, 0.0f) {}
  size_t size() const { return residue_.size(); }
  absl::Span<float> residue() { return absl::MakeSpan(residue_); }
  absl::Span<const float> residue() const { return absl::MakeConstSpan(residue_); }
  void Reset() { std::fill(residue_.begin(), residue_.end(), 0.0f); }

 private:
  std::vector<float> residue_;
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
};

// kInvalidArgument for invalid options.
absl::StatusOr<std::unique_ptr<Compressor>> MakeCompressor(const CompressorOptions& options);

// dst += factor * decompress(update). kInvalidArgument when dst.size() != update.length or
// the update is malformed (index out of range, sizes inconsistent); dst is unchanged then.
absl::Status DecompressAdd(const CompressedUpdate& update, float factor, absl::Span<float> dst);

// Returns true when every value is finite. Vectorised.
bool AllFinite(absl::Span<const float> values);

namespace internal {
// The AdaComp fast path (DESIGN.md section 1), exposed for tests and benchmarks. `residue`
// and `grad` have the same length; `gmax_scratch` is resized as needed. Does not check for
// NaN/Inf: the caller does (the Compressor does). Chooses AVX2 at run time when available
// unless `force_portable`.
void AdaCompCompressFinite(absl::Span<const float> grad, absl::Span<float> residue,
                           uint32_t bin_size, std::vector<float>& gmax_scratch,
                           CompressedUpdate& out, bool force_portable = false);
// True when this CPU runs the AVX2 path.
bool AdaCompHasAvx2();
}  // namespace internal

}  // namespace adaps

#endif  // ADAPS_COMMON_COMPRESSOR_H_
