// What a worker's DeclareSlice asks of this server, checked and translated into the engine's
// DeclareWork: the pull format against what the servers run (sparse pulls need a sparse
// step, recompressed ones no --backup_workers), the downlink's bin, the running mean or sum
// of local mode's slices (Shard::set_running_mean, Shard::KeepSum), a bucket's segments, and
// the memory a slice is budgeted at. Pure functions over the message and the server's
// settings: no sockets, no state; the sender, its secret and the budget are Server::OnDeclare's.
#ifndef ADAPS_SERVER_DECLARATION_H_
#define ADAPS_SERVER_DECLARATION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/optimizer.h"
#include "schemas/adaps_generated.h"
#include "server/engine.h"

namespace adaps {

// The server's settings a declaration is checked against.
struct DeclarationRules {
  OptimizerConfig optimizer;
  bool sync = true;
  int backup_workers = 0;
  uint32_t pull_bin_size = 0;  // --pull_bin_size (0: none)
};

// The engine's work for `d` (a length and bin size > 0, checked by the caller), or
// kFailedPrecondition, naming the tensor and the alternatives, for a pull format these
// servers cannot answer.
absl::StatusOr<DeclareWork> DeclarationWork(const msg::DeclareSlice& d,
                                            const DeclarationRules& rules);

// What one slice element is budgeted at against ServerConfig::max_memory (8 floats).
inline constexpr uint64_t kSliceBytesPerElement = 32;

// What a slice of `length` elements is budgeted at: kSliceBytesPerElement each, and a float
// more where it keeps a running sum (DeclareWork::keep_sum, Shard::keeps_sum).
inline uint64_t SliceBudgetBytes(uint64_t length, bool keeps_sum) {
  return length * (kSliceBytesPerElement + (keeps_sum ? sizeof(float) : 0));
}

}  // namespace adaps

#endif  // ADAPS_SERVER_DECLARATION_H_
