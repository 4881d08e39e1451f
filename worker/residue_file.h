// A worker's residues on disk (Worker::SaveResidues, Worker::LoadResidues): the gradient or
// update mass its error feedback holds back, per tensor, so that a restarted worker sends it.
#ifndef ADAPS_WORKER_RESIDUE_FILE_H_
#define ADAPS_WORKER_RESIDUE_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace adaps {

struct TensorResidue {
  std::string name;
  std::vector<float> residue;  // the whole tensor's
};

// The file: magic "ADAPSRS1", u64 count, per tensor its name (u64 length, bytes) and residue
// (u64 count, floats), then the CRC-32 of everything before it (u32).
std::vector<uint8_t> EncodeResidues(const std::vector<TensorResidue>& tensors);
// kDataLoss naming `path` for anything that is not such a file, whole.
absl::StatusOr<std::vector<TensorResidue>> DecodeResidues(absl::Span<const uint8_t> bytes,
                                                          const std::string& path);

}  // namespace adaps

#endif  // ADAPS_WORKER_RESIDUE_FILE_H_
