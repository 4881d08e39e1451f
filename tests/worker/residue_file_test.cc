// worker/residue_file: the residue file's codec, whole and damaged.
#include "worker/residue_file.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace adaps {
namespace {

std::vector<TensorResidue> Sample() {
  return {{"fc1.weight", {0.5f, -1.25f, 0.0f, 3.0f}}, {"bias", {}}, {"x", {7.0f}}};
}

TEST(ResidueFile, RoundTrip) {
  const std::vector<uint8_t> bytes = EncodeResidues(Sample());
  absl::StatusOr<std::vector<TensorResidue>> back = DecodeResidues(bytes, "f");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*back)[i].name, Sample()[i].name);
    EXPECT_EQ((*back)[i].residue, Sample()[i].residue);
  }
  EXPECT_TRUE(DecodeResidues(EncodeResidues({}), "f").ok());
}

TEST(ResidueFile, EveryTruncationAndBitFlipIsDataLoss) {
  const std::vector<uint8_t> bytes = EncodeResidues(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<std::vector<TensorResidue>> r =
        DecodeResidues(absl::MakeConstSpan(bytes.data(), n), "f");
    ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << n;
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bad = bytes;
      bad[i] ^= static_cast<uint8_t>(1u << bit);
      absl::StatusOr<std::vector<TensorResidue>> r = DecodeResidues(bad, "the/path");
      ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << i << ":" << bit;
      EXPECT_NE(r.status().message().find("the/path"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace adaps
