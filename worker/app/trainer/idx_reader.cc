#include "worker/app/trainer/idx_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace adaps::trainer {
namespace {

// Fashion-MNIST training-set pixel statistics (after scaling to [0, 1]).
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// gzread reads plain files as they are, so one path serves both encodings.
absl::StatusOr<std::vector<uint8_t>> ReadWholeFile(const std::string& path) {
  if (!FileExists(path)) return absl::NotFoundError(absl::StrCat("no such file: ", path));
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    const int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int errnum = 0;
      std::string msg = gzerror(f, &errnum);
      gzclose(f);
      return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", msg));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  // A truncated gzip stream ends without an error from gzread but gzclose reports it.
  const int rc = gzclose(f);
  if (rc != Z_OK && rc != Z_BUF_ERROR) {
    return absl::DataLossError(absl::StrCat("corrupt gzip stream in ", path));
  }
  if (rc == Z_BUF_ERROR) {
    return absl::DataLossError(absl::StrCat("truncated gzip stream in ", path));
  }
  return out;
}

uint32_t ReadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  ADAPS_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadWholeFile(path));
  if (bytes.size() < 4) {
    return absl::DataLossError(
        absl::StrCat(path, ": too short for an IDX header (", bytes.size(), " bytes)"));
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    return absl::DataLossError(absl::StrCat(path, ": bad IDX magic (first two bytes must be 0)"));
  }
  if (bytes[2] != 0x08) {
    return absl::DataLossError(absl::StrCat(path, ": unsupported IDX element type 0x",
                                            absl::Hex(bytes[2]), " (only 0x08, unsigned byte)"));
  }
  const int ndims = bytes[3];
  if (ndims < 1 || ndims > 4) {
    return absl::DataLossError(absl::StrCat(path, ": unsupported IDX rank ", ndims));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (bytes.size() < header) {
    return absl::DataLossError(absl::StrCat(path, ": truncated IDX header"));
  }
  IdxArray out;
  uint64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint32_t dim = ReadBigEndian32(bytes.data() + 4 + 4 * d);
    out.dims.push_back(dim);
    total *= dim;
    if (total > (uint64_t{1} << 34)) {
      return absl::DataLossError(absl::StrCat(path, ": IDX dimensions too large"));
    }
  }
  const uint64_t have = bytes.size() - header;
  if (have < total) {
    return absl::DataLossError(absl::StrCat(path, ": truncated IDX data: header promises ", total,
                                            " bytes, file holds ", have));
  }
  if (have > total) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", have - total, " trailing bytes after the IDX data"));
  }
  out.data.assign(bytes.begin() + header, bytes.end());
  return out;
}

absl::StatusOr<Dataset> LoadIdxPair(const std::string& images_path,
                                    const std::string& labels_path) {
  ADAPS_ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(images_path));
  ADAPS_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(labels_path));
  if (images.dims.size() != 3) {
    return absl::DataLossError(absl::StrCat(
        images_path, ": images file must have 3 dimensions, has ", images.dims.size()));
  }
  if (labels.dims.size() != 1) {
    return absl::DataLossError(
        absl::StrCat(labels_path, ": labels file must have 1 dimension, has ", labels.dims.size()));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " holds ", images.dims[0],
                                                   " images but ", labels_path, " holds ",
                                                   labels.dims[0], " labels"));
  }
  if (images.dims[0] > static_cast<uint32_t>(std::numeric_limits<int>::max()) ||
      images.dims[1] > 4096 || images.dims[2] > 4096) {
    return absl::DataLossError(absl::StrCat(images_path, ": implausible image dimensions"));
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] > 9) {
      return absl::DataLossError(absl::StrCat(labels_path, ": label ", int{labels.data[i]},
                                              " at index ", i, " is outside [0, 9]"));
    }
  }
  Dataset ds;
  ds.count = static_cast<int>(images.dims[0]);
  ds.rows = static_cast<int>(images.dims[1]);
  ds.cols = static_cast<int>(images.dims[2]);
  ds.images.resize(images.data.size());
  for (size_t i = 0; i < images.data.size(); ++i) {
    ds.images[i] = (images.data[i] / 255.0f - kPixelMean) / kPixelStd;
  }
  ds.labels = std::move(labels.data);
  return ds;
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  auto find = [&](const std::string& name) {
    const std::string plain = absl::StrCat(dir, "/", name);
    if (FileExists(plain)) return plain;
    return absl::StrCat(plain, ".gz");
  };
  return LoadIdxPair(find(prefix + "-images-idx3-ubyte"), find(prefix + "-labels-idx1-ubyte"));
}

}  // namespace adaps::trainer
