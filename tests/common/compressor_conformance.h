// One conformance suite for every AdaComp compressor implementation (the CPU compressor of
// common/compressor.h and the CUDA one of common/cuda/), written once as a typed gtest suite
// and instantiated per implementation:
//
//   INSTANTIATE_TYPED_TEST_SUITE_P(Cpu, AdaCompConformance, CpuBackend);
//
// The oracle is tests/common/reference_adacomp.h (docs/algorithm.md written plainly) plus the
// contract's failure rules: a NaN/Inf gradient is kInvalidArgument (kReject) or OK with an empty
// update (kSendNothing), an overflow of residue + gradient is kOutOfRange with an empty update,
// and every failed step leaves the residue bit-for-bit unchanged. Indices and signs must be
// equal; the residue bit-equal; the scale equal or within Backend::kScaleUlps float ulps (the
// GPU's fixed-order tree sum), after which the residue is resynchronised from the oracle.
//
// A Backend provides (see CpuBackend in compressor_conformance_test.cc):
//   static absl::Status Available();  // OK, or the reason every test skips
//   static constexpr int kScaleUlps;
//   static absl::StatusOr<std::unique_ptr<Backend>> Make(const CompressorOptions&, bool defer);
//   absl::StatusOr<size_t> AddSlice(size_t n);  // a new slice (residue zero); its id
//   // `g` copied `offset` floats into a buffer of offset + n + 3 floats, compressed from there.
//   absl::Status Compress(size_t slice, const std::vector<float>& g, size_t offset,
//                         CompressedUpdate& out);
//   absl::StatusOr<std::vector<float>> Residue(size_t slice);
//   absl::Status SetResidue(size_t slice, const std::vector<float>& r);
//   absl::Status Reset(size_t slice);
//   // Two phases (docs/algorithm.md: a push commits every slice's residue or none): like
//   // Compress, but a successful step's new residue waits until Commit(slice) makes it the
//   // residue or Discard(slice) drops it; Residue(slice) meanwhile is the old one.
//   absl::Status CompressPending(size_t slice, const std::vector<float>& g, size_t offset,
//                                CompressedUpdate& out);
//   absl::Status Commit(size_t slice);
//   absl::Status Discard(size_t slice);
#ifndef ADAPS_TESTS_COMMON_COMPRESSOR_CONFORMANCE_H_
#define ADAPS_TESTS_COMMON_COMPRESSOR_CONFORMANCE_H_

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compressor.h"
#include "gtest/gtest.h"
#include "tests/common/reference_adacomp.h"

namespace adaps::testing {

inline uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

inline int64_t Ulps(float a, float b) {
  return std::llabs(static_cast<int64_t>(Bits(a)) - static_cast<int64_t>(Bits(b)));
}

inline ::testing::AssertionResult SameFloats(const std::vector<float>& want,
                                             const std::vector<float>& got) {
  if (want.size() != got.size()) {
    return ::testing::AssertionFailure() << "sizes " << want.size() << " vs " << got.size();
  }
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < want.size(); ++i) {
    if (Bits(want[i]) != Bits(got[i]) && !(want[i] == 0.0f && got[i] == 0.0f)) {
      if (++bad <= 5) absl::StrAppend(&first, " [", i, "] want ", want[i], " got ", got[i], ";");
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << want.size() << " differ:" << first;
}

template <typename T>
::testing::AssertionResult SameVector(const char* what, const std::vector<T>& want,
                                      const std::vector<T>& got) {
  if (want == got) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  return ::testing::AssertionFailure() << what << ": want " << want.size() << ", got "
                                       << got.size() << "; first difference at " << i;
}

inline std::vector<float> NormalVector(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Heavy tails, exact zeros, repeated values and denormals: the shapes real gradients take.
inline std::vector<float> AdversarialVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::cauchy_distribution<float> cauchy(0.0f, 1e-3f);
  std::vector<float> v(n);
  for (float& x : v) {
    switch (pick(rng)) {
      case 0: case 1: x = 0.0f; break;
      case 2: x = 0.25f; break;
      case 3: x = -0.25f; break;
      case 4: x = std::numeric_limits<float>::denorm_min() * 7; break;
      case 5: {
        const float c = cauchy(rng);
        x = std::isfinite(c) && std::fabs(c) < 1e30f ? c : 1.0f;
        break;
      }
      default: x = normal(rng) * 1e-2f; break;
    }
  }
  return v;
}

inline CompressorOptions ConformanceOptions(uint32_t bin_size,
                                            NonFinitePolicy p = NonFinitePolicy::kReject) {
  CompressorOptions o;
  o.kind = CompressorKind::kAdaComp;
  o.bin_size = bin_size;
  o.non_finite = p;
  return o;
}

// The contract on one slice: reference_adacomp.h plus the failure rules.
class Oracle {
 public:
  Oracle(size_t n, CompressorOptions o) : residue_(n, 0.0f), o_(o) {}
  absl::StatusCode Step(const std::vector<float>& g, CompressedUpdate& out) {
    out.Clear();
    out.kind = CompressorKind::kAdaComp;
    out.length = static_cast<uint32_t>(g.size());
    out.bin_size = o_.bin_size;
    for (size_t i = 0; i < g.size(); ++i) {
      if (!std::isfinite(g[i])) {
        return o_.non_finite == NonFinitePolicy::kSendNothing ? absl::StatusCode::kOk
                                                               : absl::StatusCode::kInvalidArgument;
      }
    }
    for (size_t i = 0; i < g.size(); ++i) {
      if (!std::isfinite(residue_[i] + g[i])) return absl::StatusCode::kOutOfRange;
    }
    const ReferenceResult r = ReferenceAdaComp(g, residue_, o_.bin_size);
    out.scale = r.scale;
    out.indices = r.indices;
    out.negative = r.negative;
    return absl::StatusCode::kOk;
  }
  std::vector<float>& residue() { return residue_; }

 private:
  std::vector<float> residue_;
  CompressorOptions o_;
};

// A backend and the oracle on any number of slices, compared after every step.
template <typename Backend>
class Checked {
 public:
  Checked(CompressorOptions o, bool defer) : o_(o) {
    auto b = Backend::Make(o, defer);
    EXPECT_TRUE(b.ok()) << b.status();
    if (b.ok()) backend_ = std::move(b).value();
  }
  bool ok() const { return backend_ != nullptr; }
  Backend& backend() { return *backend_; }

  size_t AddSlice(size_t n) {
    auto id = backend_->AddSlice(n);
    EXPECT_TRUE(id.ok()) << id.status();
    oracles_.emplace_back(n, o_);
    return id.ok() ? *id : 0;
  }

  // One step on `slice`; returns the oracle's status code after checking the backend agrees.
  absl::StatusCode Step(size_t slice, const std::vector<float>& g, const std::string& where,
                        bool compare_residue = true, size_t offset = 0) {
    SCOPED_TRACE(where);
    Oracle& oracle = oracles_[slice];
    const std::vector<float> before = oracle.residue();
    const absl::StatusCode want = oracle.Step(g, want_);
    const absl::Status got = backend_->Compress(slice, g, offset, got_);
    EXPECT_EQ(want, got.code()) << got;
    EXPECT_EQ(got_.kind, want_.kind);
    EXPECT_EQ(got_.length, want_.length);
    EXPECT_EQ(got_.bin_size, want_.bin_size);
    EXPECT_TRUE(SameVector("indices", want_.indices, got_.indices));
    EXPECT_TRUE(SameVector("negative", want_.negative, got_.negative));
    if (want != absl::StatusCode::kOk) {
      EXPECT_TRUE(SameFloats(before, oracle.residue()));
    }
    if (Bits(want_.scale) != Bits(got_.scale)) {
      EXPECT_LE(Ulps(want_.scale, got_.scale), Backend::kScaleUlps)
          << "scale: want " << want_.scale << " got " << got_.scale;
      const absl::Status s = backend_->SetResidue(slice, oracle.residue());  // resynchronise
      EXPECT_TRUE(s.ok()) << s;
      return want;
    }
    if (compare_residue || want != absl::StatusCode::kOk) {
      auto r = backend_->Residue(slice);
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) {
        EXPECT_TRUE(SameFloats(oracle.residue(), *r));
      }
    }
    return want;
  }

  // One push of a tensor cut into `slices` (docs/algorithm.md): every slice is compressed
  // in two phases and checked against the oracle, the residues are compared with the old ones
  // while the new ones are pending, then all are committed when every slice succeeded and all
  // discarded otherwise (the oracles alike). Returns the first failing slice's oracle code.
  absl::StatusCode Push(const std::vector<size_t>& slices,
                        const std::vector<std::vector<float>>& grads, const std::string& where) {
    SCOPED_TRACE(where);
    absl::StatusCode first = absl::StatusCode::kOk;
    std::vector<std::vector<float>> before, after;
    std::vector<bool> scale_off;  // the backend's scale within its ulps but not equal
    for (size_t j = 0; j < slices.size(); ++j) {
      SCOPED_TRACE(absl::StrCat("slice ", slices[j]));
      Oracle& oracle = oracles_[slices[j]];
      before.push_back(oracle.residue());
      const absl::StatusCode want = oracle.Step(grads[j], want_);
      after.push_back(oracle.residue());
      oracle.residue() = before.back();  // the oracle's step is pending too
      const absl::Status got = backend_->CompressPending(slices[j], grads[j], 0, got_);
      EXPECT_EQ(want, got.code()) << got;
      EXPECT_TRUE(SameVector("indices", want_.indices, got_.indices));
      EXPECT_TRUE(SameVector("negative", want_.negative, got_.negative));
      EXPECT_LE(Ulps(want_.scale, got_.scale), Backend::kScaleUlps)
          << "scale: want " << want_.scale << " got " << got_.scale;
      scale_off.push_back(Bits(want_.scale) != Bits(got_.scale));
      if (first == absl::StatusCode::kOk) first = want;
    }
    for (size_t j = 0; j < slices.size(); ++j) {
      SCOPED_TRACE(absl::StrCat("pending, slice ", slices[j]));
      auto r = backend_->Residue(slices[j]);
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) {
        EXPECT_TRUE(SameFloats(before[j], *r));
      }
    }
    for (size_t j = 0; j < slices.size(); ++j) {
      SCOPED_TRACE(absl::StrCat("after the push, slice ", slices[j]));
      const absl::Status s = first == absl::StatusCode::kOk ? backend_->Commit(slices[j])
                                                            : backend_->Discard(slices[j]);
      EXPECT_TRUE(s.ok()) << s;
      if (first == absl::StatusCode::kOk) oracles_[slices[j]].residue() = after[j];
      auto r = backend_->Residue(slices[j]);
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) {
        // Bit-equal, unless the backend's scale was one of its allowed ulps off: then the
        // fixed-up residue may be too, and the oracle's is taken (as Step does).
        if (first == absl::StatusCode::kOk && scale_off[j]) {
          SetResidue(slices[j], oracles_[slices[j]].residue());
        } else {
          EXPECT_TRUE(SameFloats(oracles_[slices[j]].residue(), *r));
        }
      }
    }
    return first;
  }

  void SetResidue(size_t slice, const std::vector<float>& r) {
    oracles_[slice].residue() = r;
    const absl::Status s = backend_->SetResidue(slice, r);
    EXPECT_TRUE(s.ok()) << s;
  }
  void Reset(size_t slice) {
    std::fill(oracles_[slice].residue().begin(), oracles_[slice].residue().end(), 0.0f);
    const absl::Status s = backend_->Reset(slice);
    EXPECT_TRUE(s.ok()) << s;
  }
  const CompressedUpdate& got() const { return got_; }

 private:
  CompressorOptions o_;
  std::unique_ptr<Backend> backend_;
  std::vector<Oracle> oracles_;
  CompressedUpdate want_, got_;
};

template <typename Backend>
class AdaCompConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status s = Backend::Available();
    if (!s.ok()) GTEST_SKIP() << "backend unavailable: " << s;
  }
};

TYPED_TEST_SUITE_P(AdaCompConformance);

// Lengths around multiples of the bin size, over bin sizes of every kernel path (T <= 1024,
// 1024 < T <= 2048, T > 2048), both fix-up modes; the residue is compared after some steps
// only, so the others exercise a fix-up still pending when the next step starts.
TYPED_TEST_P(AdaCompConformance, MatchesTheOracleOnRandomGradientsOverSteps) {
  for (uint32_t t : {1u, 3u, 50u, 500u, 1025u, 1366u, 2048u, 2049u, 5000u}) {
    for (size_t n : {size_t{1}, size_t{t > 1 ? t - 1 : 1}, size_t{t}, size_t{t} + 1,
                     7 * size_t{t} + 3, (size_t{1} << 18) + 13}) {
      for (bool defer : {true, false}) {
        SCOPED_TRACE(absl::StrCat("T ", t, " n ", n, defer ? " deferred" : " eager"));
        Checked<TypeParam> c(ConformanceOptions(t), defer);
        ASSERT_TRUE(c.ok());
        const size_t s = c.AddSlice(n);
        for (uint32_t step = 0; step < 4; ++step) {
          const float sigma = step == 2 ? 1e-6f : 1.0f / static_cast<float>(1 + step);
          ASSERT_EQ(c.Step(s, NormalVector(n, sigma, 1000 * t + step), absl::StrCat("step ", step),
                           step == 1 || step == 3),
                    absl::StatusCode::kOk);
        }
      }
    }
  }
}

TYPED_TEST_P(AdaCompConformance, MatchesTheOracleOnAdversarialGradients) {
  for (uint32_t t : {1u, 50u, 500u, 1500u, 5000u}) {
    const size_t n = 9 * size_t{t} + 5;
    Checked<TypeParam> c(ConformanceOptions(t), true);
    ASSERT_TRUE(c.ok());
    const size_t s = c.AddSlice(n);
    for (uint32_t step = 0; step < 4; ++step) {
      ASSERT_EQ(c.Step(s, AdversarialVector(n, 77 * t + step), absl::StrCat("T ", t, " step ", step),
                       step == 3),
                absl::StatusCode::kOk);
    }
  }
}

// More than one wave of thread blocks on any GPU (2^24 elements: over 8000 tiles).
TYPED_TEST_P(AdaCompConformance, MatchesTheOracleOnASliceOfMoreThan16MElements) {
  const size_t n = (size_t{1} << 24) + 7;
  for (uint32_t t : {500u, 50u}) {
    Checked<TypeParam> c(ConformanceOptions(t), true);
    ASSERT_TRUE(c.ok());
    const size_t s = c.AddSlice(n);
    for (uint32_t step = 0; step < 3; ++step) {
      ASSERT_EQ(c.Step(s, NormalVector(n, 1.0f, 31 * t + step), absl::StrCat("T ", t, " step ", step),
                       step == 2),
                absl::StatusCode::kOk);
    }
  }
}

TYPED_TEST_P(AdaCompConformance, FiniteDataThroughAnOffsetPointerMatches) {
  const size_t n = 4099;
  for (size_t offset : {1u, 2u, 3u, 5u}) {
    Checked<TypeParam> c(ConformanceOptions(50), true);
    ASSERT_TRUE(c.ok());
    const size_t s = c.AddSlice(n);
    for (uint32_t step = 0; step < 3; ++step) {
      ASSERT_EQ(c.Step(s, NormalVector(n, 1.0f, 40 + step), absl::StrCat("offset ", offset), true,
                       offset),
                absl::StatusCode::kOk);
    }
  }
}

TYPED_TEST_P(AdaCompConformance, NonFiniteGradientIsRejectedAndLeavesTheResidueAndFixupAlone) {
  for (uint32_t t : {50u, 1500u, 5000u}) {  // every kernel path finds it
    const size_t n = 7 * size_t{t} + 11;
    Checked<TypeParam> c(ConformanceOptions(t), true);
    ASSERT_TRUE(c.ok());
    const size_t s = c.AddSlice(n);
    // No residue comparison after "before": its fix-up stays pending through the bad steps.
    ASSERT_EQ(c.Step(s, NormalVector(n, 1.0f, 5), "before", false), absl::StatusCode::kOk);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      for (size_t pos : {size_t{0}, n / 2, n - 1}) {
        std::vector<float> g = NormalVector(n, 1.0f, 6);
        g[pos] = bad;
        EXPECT_EQ(c.Step(s, g, absl::StrCat("T ", t, " bad ", bad, " at ", pos), pos == n - 1),
                  absl::StatusCode::kInvalidArgument);
      }
    }
    ASSERT_EQ(c.Step(s, NormalVector(n, 1.0f, 7), absl::StrCat("T ", t, " after")),
              absl::StatusCode::kOk);
  }
}

TYPED_TEST_P(AdaCompConformance, NonFiniteGradientWithSendNothingGivesAnEmptyUpdate) {
  const size_t n = 1000;
  Checked<TypeParam> c(ConformanceOptions(50, NonFinitePolicy::kSendNothing), true);
  ASSERT_TRUE(c.ok());
  const size_t s = c.AddSlice(n);
  ASSERT_EQ(c.Step(s, NormalVector(n, 1.0f, 8), "before", false), absl::StatusCode::kOk);
  std::vector<float> g = NormalVector(n, 1.0f, 9);
  g[123] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_EQ(c.Step(s, g, "nan"), absl::StatusCode::kOk);
  EXPECT_TRUE(c.got().indices.empty());
  ASSERT_EQ(c.Step(s, NormalVector(n, 1.0f, 10), "after"), absl::StatusCode::kOk);
}

// An overflow is kOutOfRange with an empty update, leaves the residue (and a pending fix-up)
// unchanged, and the slice keeps working: later steps match the oracle.
TYPED_TEST_P(AdaCompConformance, OverflowIsOutOfRangeAndLaterStepsStillMatch) {
  for (uint32_t t : {10u, 1500u, 5000u}) {  // every kernel path
    for (bool defer : {true, false}) {
      SCOPED_TRACE(absl::StrCat("T ", t, defer ? " deferred" : " eager"));
      const size_t n = 3 * size_t{t} + 1000;
      Checked<TypeParam> c(ConformanceOptions(t), defer);
      ASSERT_TRUE(c.ok());
      const size_t s = c.AddSlice(n);
      std::vector<float> r = NormalVector(n, 1.0f, 20);
      r[t + 5] = 3e38f;
      c.SetResidue(s, r);
      ASSERT_EQ(c.Step(s, NormalVector(n, 1.0f, 19), "pending fix-up", false),
                absl::StatusCode::kOk);
      std::vector<float> g = NormalVector(n, 1.0f, 21);
      g[t + 5] = 3e38f;  // residue + gradient overflows to +Inf in bin 1
      EXPECT_EQ(c.Step(s, g, "overflow"), absl::StatusCode::kOutOfRange);
      EXPECT_TRUE(c.got().indices.empty());
      EXPECT_EQ(c.got().scale, 0.0f);
      EXPECT_EQ(c.Step(s, g, "overflow again", false), absl::StatusCode::kOutOfRange);
      for (uint32_t step = 0; step < 4; ++step) {
        ASSERT_EQ(c.Step(s, NormalVector(n, 1.0f, 22 + step), absl::StrCat("after ", step),
                         step % 2 == 1),
                  absl::StatusCode::kOk);
      }
    }
  }
}

// Two slices of different lengths interleaved on one compressor keep separate residues.
TYPED_TEST_P(AdaCompConformance, TwoSlicesOnOneCompressorStayIndependent) {
  Checked<TypeParam> c(ConformanceOptions(50), true);
  ASSERT_TRUE(c.ok());
  const size_t a = c.AddSlice(100003);
  const size_t b = c.AddSlice(777);
  for (uint32_t step = 0; step < 4; ++step) {
    ASSERT_EQ(c.Step(a, NormalVector(100003, 1.0f, 60 + step), absl::StrCat("a ", step), step == 3),
              absl::StatusCode::kOk);
    ASSERT_EQ(c.Step(b, NormalVector(777, 1.0f, 70 + step), absl::StrCat("b ", step), step == 2),
              absl::StatusCode::kOk);
  }
}

TYPED_TEST_P(AdaCompConformance, HandMadeInputsMatch) {
  Checked<TypeParam> c(ConformanceOptions(50), true);
  ASSERT_TRUE(c.ok());
  const size_t zeros = c.AddSlice(12345);
  ASSERT_EQ(c.Step(zeros, std::vector<float>(12345, 0.0f), "all zero"), absl::StatusCode::kOk);
  EXPECT_TRUE(c.got().indices.empty());
  EXPECT_EQ(c.got().scale, 0.0f);
  const size_t ties = c.AddSlice(500);
  std::vector<float> g(500);
  for (size_t i = 0; i < g.size(); ++i) g[i] = (i % 3 == 0) ? -0.5f : 0.5f;
  ASSERT_EQ(c.Step(ties, g, "ties"), absl::StatusCode::kOk);
  EXPECT_EQ(c.got().indices.size(), 500u);
  ASSERT_EQ(c.Step(ties, g, "ties again"), absl::StatusCode::kOk);
  const size_t empty = c.AddSlice(0);
  ASSERT_EQ(c.Step(empty, {}, "empty"), absl::StatusCode::kOk);
  EXPECT_EQ(c.got().length, 0u);
}

TYPED_TEST_P(AdaCompConformance, ResetZeroesTheResidueAndDropsThePendingFixup) {
  Checked<TypeParam> c(ConformanceOptions(50), true);
  ASSERT_TRUE(c.ok());
  const size_t s = c.AddSlice(5000);
  ASSERT_EQ(c.Step(s, NormalVector(5000, 1.0f, 12), "step", false), absl::StatusCode::kOk);
  c.Reset(s);
  ASSERT_EQ(c.Step(s, NormalVector(5000, 1.0f, 13), "after reset"), absl::StatusCode::kOk);
}

// docs/algorithm.md: a push compresses every slice first and commits the residues only when
// all succeeded. A tensor of three slices (different lengths, every kernel path's bin count);
// a NaN in the last slice or an overflow in the middle one leaves every residue as it was,
// including the slices before it that compressed fine; pushes before and after commit all.
TYPED_TEST_P(AdaCompConformance, APushOfSeveralSlicesCommitsAllOrNone) {
  for (bool defer : {true, false}) {
    SCOPED_TRACE(defer ? "deferred" : "eager");
    Checked<TypeParam> c(ConformanceOptions(50), defer);
    ASSERT_TRUE(c.ok());
    const std::vector<size_t> lengths = {5000, 777, 100003};
    std::vector<size_t> slices;
    for (size_t n : lengths) slices.push_back(c.AddSlice(n));
    auto grads = [&](uint32_t seed) {
      std::vector<std::vector<float>> g;
      for (size_t j = 0; j < lengths.size(); ++j) {
        g.push_back(NormalVector(lengths[j], 1.0f, seed + static_cast<uint32_t>(j)));
      }
      return g;
    };
    ASSERT_EQ(c.Push(slices, grads(100), "push 0"), absl::StatusCode::kOk);
    ASSERT_EQ(c.Push(slices, grads(110), "push 1"), absl::StatusCode::kOk);
    std::vector<std::vector<float>> g = grads(120);
    g[2][4321] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(c.Push(slices, g, "NaN in the last slice"), absl::StatusCode::kInvalidArgument);
    g = grads(130);
    std::vector<float> r = NormalVector(lengths[1], 1.0f, 140);
    r[100] = 3e38f;
    c.SetResidue(slices[1], r);
    g[1][100] = 3e38f;  // residue + gradient overflows in the middle slice
    EXPECT_EQ(c.Push(slices, g, "overflow in the middle slice"), absl::StatusCode::kOutOfRange);
    g[1][100] = -3e38f;
    ASSERT_EQ(c.Push(slices, g, "push after the failures"), absl::StatusCode::kOk);
    ASSERT_EQ(c.Push(slices, grads(150), "push 4"), absl::StatusCode::kOk);
    // A single slice's plain step after the pushes still matches.
    ASSERT_EQ(c.Step(slices[0], NormalVector(lengths[0], 1.0f, 160), "plain step"),
              absl::StatusCode::kOk);
  }
}

// Slices of over a million elements (over 512 tiles in every GPU layout: the GPU scans their
// output offsets in a kernel of its own, smaller ones in the scatter; common/cuda) on every
// kernel path (T = 1, fused, T > 2048), both fix-up modes: plain steps, a NaN, and a push of two
// slices that fails on the small one and must leave the large one's residue alone.
TYPED_TEST_P(AdaCompConformance, SlicesOfOverAMillionElementsMatchOnEveryPath) {
  const size_t n = (size_t{1} << 20) + 4099;
  for (uint32_t t : {1u, 500u, 5000u}) {
    for (bool defer : {true, false}) {
      SCOPED_TRACE(absl::StrCat("T ", t, defer ? " deferred" : " eager"));
      Checked<TypeParam> c(ConformanceOptions(t), defer);
      ASSERT_TRUE(c.ok());
      const size_t big = c.AddSlice(n);
      const size_t small = c.AddSlice(777);
      ASSERT_EQ(c.Step(big, NormalVector(n, 1.0f, 200 + t), "step 0", false),
                absl::StatusCode::kOk);
      std::vector<float> g = NormalVector(n, 1.0f, 201 + t);
      g[n - 1] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_EQ(c.Step(big, g, "NaN in the last element"), absl::StatusCode::kInvalidArgument);
      ASSERT_EQ(c.Step(big, NormalVector(n, 1.0f, 202 + t), "step 2"), absl::StatusCode::kOk);
      std::vector<std::vector<float>> both = {NormalVector(n, 1.0f, 203 + t),
                                              NormalVector(777, 1.0f, 204 + t)};
      both[1][5] = std::numeric_limits<float>::infinity();
      EXPECT_EQ(c.Push({big, small}, both, "Inf in the small slice"),
                absl::StatusCode::kInvalidArgument);
      both[1][5] = 0.5f;
      ASSERT_EQ(c.Push({big, small}, both, "push"), absl::StatusCode::kOk);
    }
  }
}

REGISTER_TYPED_TEST_SUITE_P(AdaCompConformance, MatchesTheOracleOnRandomGradientsOverSteps,
                            MatchesTheOracleOnAdversarialGradients,
                            MatchesTheOracleOnASliceOfMoreThan16MElements,
                            FiniteDataThroughAnOffsetPointerMatches,
                            NonFiniteGradientIsRejectedAndLeavesTheResidueAndFixupAlone,
                            NonFiniteGradientWithSendNothingGivesAnEmptyUpdate,
                            OverflowIsOutOfRangeAndLaterStepsStillMatch,
                            TwoSlicesOnOneCompressorStayIndependent, HandMadeInputsMatch,
                            ResetZeroesTheResidueAndDropsThePendingFixup,
                            APushOfSeveralSlicesCommitsAllOrNone,
                            SlicesOfOverAMillionElementsMatchOnEveryPath);

}  // namespace adaps::testing

#endif  // ADAPS_TESTS_COMMON_COMPRESSOR_CONFORMANCE_H_
