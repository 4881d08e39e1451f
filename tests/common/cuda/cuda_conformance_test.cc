// The shared AdaComp conformance suite (tests/common/compressor_conformance.h) on the GPU: same
// indices, signs and residue as the oracle, the scale within one float ulp (the fixed-order
// tree sum documented in cuda_compressor.h). Every test skips with the reason without a GPU.
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compressor.h"
#include "common/cuda/cuda_compressor.h"
#include "gtest/gtest.h"
#include "tests/common/compressor_conformance.h"

namespace adaps {
namespace cuda {
namespace {

class CudaBackend {
 public:
  static constexpr int kScaleUlps = 1;  // the documented fixed-order tree sum
  static absl::Status Available() { return CudaAvailable(); }
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Make(const CompressorOptions& o,
                                                           bool defer) {
    auto c = MakeCudaAdaComp(o, defer);
    if (!c.ok()) return c.status();
    auto b = std::make_unique<CudaBackend>();
    b->compressor_ = std::move(c).value();
    return b;
  }
  absl::StatusOr<size_t> AddSlice(size_t n) {
    auto st = CudaSliceState::Create(n);
    if (!st.ok()) return st.status();
    slices_.push_back(std::move(st).value());
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
  absl::Status Commit(size_t slice) { return slices_[slice]->Commit(); }
  absl::Status Discard(size_t slice) { return slices_[slice]->Discard(); }
  absl::StatusOr<std::vector<float>> Residue(size_t slice) {
    std::vector<float> r(slices_[slice]->size());
    const absl::Status s = slices_[slice]->DownloadResidue(absl::MakeSpan(r));
    if (!s.ok()) return s;
    return r;
  }
  absl::Status SetResidue(size_t slice, const std::vector<float>& r) {
    return slices_[slice]->UploadResidue(r);
  }
  absl::Status Reset(size_t slice) { return slices_[slice]->Reset(); }

 private:
  // `g` copied `offset` floats into a device buffer of offset + n + 3 floats, compressed from
  // there in one phase or two.
  absl::Status Step(size_t slice, const std::vector<float>& g, size_t offset, CompressedUpdate& out,
                    bool pending) {
    std::vector<float> buf(offset + g.size() + 3, 0.0f);
    std::copy(g.begin(), g.end(), buf.begin() + offset);
    auto dev = DeviceBuffer::FromHost(buf);
    if (!dev.ok()) return dev.status();
    const float* grad = dev->floats() + offset;
    CudaSliceState& state = *slices_[slice];
    return pending ? compressor_->CompressPending(grad, g.size(), state, out)
                   : compressor_->Compress(grad, g.size(), state, out);
  }

  std::unique_ptr<CudaCompressor> compressor_;
  std::vector<std::unique_ptr<CudaSliceState>> slices_;
};

}  // namespace
}  // namespace cuda

namespace testing {
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, AdaCompConformance, cuda::CudaBackend);
}  // namespace testing
}  // namespace adaps
