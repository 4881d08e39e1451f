// The shared AdaComp conformance suite (compressor_conformance.h) on the CPU compressor.
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compressor.h"
#include "gtest/gtest.h"
#include "tests/common/compressor_conformance.h"

namespace adaps::testing {
namespace {

class CpuBackend {
 public:
  static constexpr int kScaleUlps = 0;  // the same sequential double sum as the oracle
  static absl::Status Available() { return absl::OkStatus(); }
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Make(const CompressorOptions& o,
                                                          bool /*defer: GPU only*/) {
    auto c = MakeCompressor(o);
    if (!c.ok()) return c.status();
    auto b = std::make_unique<CpuBackend>();
    b->compressor_ = std::move(c).value();
    return b;
  }
  absl::StatusOr<size_t> AddSlice(size_t n) {
    slices_.push_back(std::make_unique<SliceState>(n));
    return slices_.size() - 1;
  }
  absl::Status Compress(size_t slice, const std::vector<float>& g, size_t offset,
                        CompressedUpdate& out) {
    return Step(slice, g, offset, out, /*pending=*/false);
  }
  absl::Status CompressPending(size_t slice, const std::vector<float>& g, size_t offset,
                               CompressedUpdate& out) {
    return Step(slice, g, offset, out, /*pending=*/true);
  }
  absl::Status Commit(size_t slice) {
    slices_[slice]->Commit();
    return absl::OkStatus();
  }
  absl::Status Discard(size_t slice) {
    slices_[slice]->Discard();
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<float>> Residue(size_t slice) {
    const absl::Span<const float> r = slices_[slice]->residue();
    return std::vector<float>(r.begin(), r.end());
  }
  absl::Status SetResidue(size_t slice, const std::vector<float>& r) {
    std::copy(r.begin(), r.end(), slices_[slice]->residue().begin());
    return absl::OkStatus();
  }
  absl::Status Reset(size_t slice) {
    slices_[slice]->Reset();
    return absl::OkStatus();
  }

 private:
  // `g` copied `offset` floats into a buffer of offset + n + 3 floats, compressed from there in
  // one phase or two.
  absl::Status Step(size_t slice, const std::vector<float>& g, size_t offset, CompressedUpdate& out,
                    bool pending) {
    std::vector<float> buf(offset + g.size() + 3, 0.0f);
    std::copy(g.begin(), g.end(), buf.begin() + offset);
    const absl::Span<const float> grad = absl::MakeConstSpan(buf.data() + offset, g.size());
    return pending ? compressor_->CompressPending(grad, *slices_[slice], out)
                   : compressor_->Compress(grad, *slices_[slice], out);
  }

  std::unique_ptr<Compressor> compressor_;
  std::vector<std::unique_ptr<SliceState>> slices_;
};

INSTANTIATE_TYPED_TEST_SUITE_P(Cpu, AdaCompConformance, CpuBackend);

}  // namespace
}  // namespace adaps::testing
