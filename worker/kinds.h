// Internal to the worker library: the one conversion between each public API enum
// (adaps/worker.h, which may not include common/ headers) and its codec or schema twin.
// The static_asserts keep the numberings equal.
#ifndef ADAPS_WORKER_KINDS_H_
#define ADAPS_WORKER_KINDS_H_

#include <cstdint>

#include "adaps/worker.h"
#include "common/compressor.h"
#include "schemas/adaps_generated.h"

namespace adaps {

static_assert(static_cast<int>(Compression::kDense) == static_cast<int>(CompressorKind::kDense));
static_assert(static_cast<int>(Compression::kAdaComp) ==
              static_cast<int>(CompressorKind::kAdaComp));
static_assert(static_cast<int>(Compression::kTopK) == static_cast<int>(CompressorKind::kTopK));
static_assert(static_cast<int>(Compression::kSign) == static_cast<int>(CompressorKind::kSign));
static_assert(static_cast<int>(PullFormat::kDense) == static_cast<int>(msg::PullFormat::Dense));
static_assert(static_cast<int>(PullFormat::kRecompressed) ==
              static_cast<int>(msg::PullFormat::Recompressed));

// A value outside the enum stays outside it; ValidateOptions rejects it.
inline CompressorKind CodecKind(Compression c) { return static_cast<CompressorKind>(c); }
inline Compression ApiCompression(CompressorKind k) { return static_cast<Compression>(k); }
inline msg::PullFormat WirePullFormat(PullFormat p) {
  switch (p) {
    case PullFormat::kRecompressed:
      return msg::PullFormat::Recompressed;
    case PullFormat::kSparse:
      return msg::PullFormat::Sparse;
    default:
      return msg::PullFormat::Dense;
  }
}
// The format of the dense pull that (re)sets a tensor's replica: the servers' parameters
// for dense and sparse pulls (the sparse answers are the changes of the parameters); for
// recompressed ones what the server has published, which the next
// recompressed answers are the change from (its parameters run ahead of it by the
// downlink's residue).
inline msg::PullFormat ReplicaFormat(PullFormat p) {
  return p == PullFormat::kRecompressed ? msg::PullFormat::Replica : msg::PullFormat::Dense;
}
// Whether a tensor pulled this way keeps a replica: recompressed and sparse answers are
// changes applied to it; a dense answer is the whole value, and a replica would be a copy
// of the tensor that nothing reads.
inline bool KeepsReplica(PullFormat p) { return p != PullFormat::kDense; }
// Whether a worker that joins takes this tensor's starting values from the servers' running
// sum (TensorSpec::keep_sum; a Replica pull) rather than its initial pull: recompressed
// pulls' initial pull is that sum already.
inline bool JoinsFromSum(const TensorSpec& spec) {
  return spec.keep_sum && spec.pull != PullFormat::kRecompressed;
}
// The version of the replica such an answer holds (a Replica answer's `version` is the
// slice's step).
inline uint64_t ReplicaVersion(const msg::PullResponse& r) {
  return r.format() == msg::PullFormat::Replica ? r.base_version() : r.version();
}

}  // namespace adaps

#endif  // ADAPS_WORKER_KINDS_H_
