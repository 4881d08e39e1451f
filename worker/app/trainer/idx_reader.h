// Reading the IDX files of (Fashion-)MNIST, plain or gzip-compressed, and loading the
// Fashion-MNIST training or test split as normalised float images.
//
// Ownership: every function returns values the caller owns. Thread-safety: the functions
// keep no state and may be called from any thread.
// Failure: kNotFound for a missing file, kDataLoss for a file that is not a well-formed
// IDX file (bad magic, unsupported element type, truncated data, wrong label range), and
// kInvalidArgument when an images file and its labels file do not match.
#ifndef ADAPS_WORKER_APP_TRAINER_IDX_READER_H_
#define ADAPS_WORKER_APP_TRAINER_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace adaps::trainer {

// One IDX file of unsigned bytes (element type 0x08): its dimensions and its data.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;  // product(dims) bytes, row-major
};

// Reads `path`; gzip-compressed files (magic 1f 8b) are decompressed transparently.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

// A labelled image set. Pixels are scaled to [0, 1] and then standardised with the
// Fashion-MNIST training mean and standard deviation.
struct Dataset {
  int count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<float> images;    // count x (rows*cols), row-major
  std::vector<uint8_t> labels;  // count, each in [0, 9]
  int image_size() const { return rows * cols; }
  const float* image(int i) const { return images.data() + static_cast<size_t>(i) * image_size(); }
};

// Builds a Dataset from an images file (3 dimensions) and a labels file (1 dimension).
absl::StatusOr<Dataset> LoadIdxPair(const std::string& images_path, const std::string& labels_path);

// Loads `train-*` or `t10k-*` from `dir`, taking `<name>` or else `<name>.gz`.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train);

}  // namespace adaps::trainer

#endif  // ADAPS_WORKER_APP_TRAINER_IDX_READER_H_
