#include "worker/app/trainer/idx_reader.h"

#include <zlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace adaps::trainer {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/adaps_idx_" + name;
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

void WriteGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

void PutBigEndian(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

// An IDX file of unsigned bytes with `dims`, filled with 0, 1, 2, ...
std::vector<uint8_t> Idx(const std::vector<uint32_t>& dims, size_t drop = 0) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  size_t n = 1;
  for (uint32_t d : dims) {
    PutBigEndian(out, d);
    n *= d;
  }
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(i % 10));
  out.resize(out.size() - drop);
  return out;
}

TEST(IdxReader, ReadsDimensionsAndData) {
  const std::string path = TempPath("good");
  WriteFile(path, Idx({3, 2, 2}));
  auto a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<uint32_t>{3, 2, 2}));
  ASSERT_EQ(a->data.size(), 12u);
  EXPECT_EQ(a->data[11], 1);
}

TEST(IdxReader, ReadsGzipCompressedFiles) {
  const std::string path = TempPath("good.gz");
  WriteGzip(path, Idx({4, 3}));
  auto a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<uint32_t>{4, 3}));
  EXPECT_EQ(a->data.size(), 12u);
}

TEST(IdxReader, ReportsAMissingFileAsNotFound) {
  auto a = ReadIdxFile(TempPath("does-not-exist"));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(a.status().message().find("does-not-exist"), std::string::npos);
}

TEST(IdxReader, RejectsABadMagic) {
  std::vector<uint8_t> bytes = Idx({2, 2});
  bytes[0] = 0x12;
  const std::string path = TempPath("badmagic");
  WriteFile(path, bytes);
  auto a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(a.status().message().find("magic"), std::string::npos);
}

TEST(IdxReader, RejectsAnUnsupportedElementType) {
  std::vector<uint8_t> bytes = Idx({2, 2});
  bytes[2] = 0x0D;  // float
  const std::string path = TempPath("float");
  WriteFile(path, bytes);
  EXPECT_EQ(ReadIdxFile(path).status().code(), absl::StatusCode::kDataLoss);
}

TEST(IdxReader, RejectsTruncatedData) {
  const std::string path = TempPath("truncated");
  WriteFile(path, Idx({5, 4}, /*drop=*/3));
  auto a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(a.status().message().find("truncated"), std::string::npos);
}

TEST(IdxReader, RejectsATruncatedHeader) {
  const std::string path = TempPath("shortheader");
  std::vector<uint8_t> bytes = Idx({5, 4});
  bytes.resize(6);
  WriteFile(path, bytes);
  EXPECT_EQ(ReadIdxFile(path).status().code(), absl::StatusCode::kDataLoss);
}

TEST(IdxReader, RejectsATruncatedGzipStream) {
  const std::string full = TempPath("full.gz");
  WriteGzip(full, Idx({200, 50}));
  std::FILE* f = std::fopen(full.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::vector<uint8_t> bytes(1 << 16);
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
  std::fclose(f);
  bytes.resize(bytes.size() / 2);
  const std::string path = TempPath("cut.gz");
  WriteFile(path, bytes);
  EXPECT_EQ(ReadIdxFile(path).status().code(), absl::StatusCode::kDataLoss);
}

TEST(IdxReader, RejectsTrailingBytes) {
  std::vector<uint8_t> bytes = Idx({2, 2});
  bytes.push_back(7);
  const std::string path = TempPath("trailing");
  WriteFile(path, bytes);
  EXPECT_EQ(ReadIdxFile(path).status().code(), absl::StatusCode::kDataLoss);
}

TEST(LoadIdxPair, BuildsStandardisedImagesAndLabels) {
  WriteFile(TempPath("img"), Idx({3, 2, 2}));
  WriteFile(TempPath("lbl"), Idx({3}));
  auto ds = LoadIdxPair(TempPath("img"), TempPath("lbl"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->count, 3);
  EXPECT_EQ(ds->image_size(), 4);
  EXPECT_EQ(ds->labels, (std::vector<uint8_t>{0, 1, 2}));
  EXPECT_NEAR(ds->images[0], (0.0f - 0.2860f) / 0.3530f, 1e-5);
}

TEST(LoadIdxPair, RejectsMismatchedCounts) {
  WriteFile(TempPath("img3"), Idx({3, 2, 2}));
  WriteFile(TempPath("lbl2"), Idx({2}));
  EXPECT_EQ(LoadIdxPair(TempPath("img3"), TempPath("lbl2")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoadIdxPair, RejectsLabelsOutsideTenClasses) {
  std::vector<uint8_t> labels = Idx({3});
  labels.back() = 10;
  WriteFile(TempPath("img3b"), Idx({3, 2, 2}));
  WriteFile(TempPath("badlbl"), labels);
  EXPECT_EQ(LoadIdxPair(TempPath("img3b"), TempPath("badlbl")).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(LoadIdxPair, RejectsAnImagesFileOfTheWrongRank) {
  WriteFile(TempPath("img2d"), Idx({3, 4}));
  WriteFile(TempPath("lbl3"), Idx({3}));
  EXPECT_EQ(LoadIdxPair(TempPath("img2d"), TempPath("lbl3")).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(LoadFashionMnist, ReportsAMissingDirectoryAsNotFound) {
  EXPECT_EQ(LoadFashionMnist(TempPath("no-such-dir"), true).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace adaps::trainer
