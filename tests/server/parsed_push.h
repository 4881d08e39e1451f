// Shards and sparse answers take a push parsed where the server receives it (Server::OnPush:
// ParseUpdate). Tests hold raw bytes: these parse them as the server does (a parse error is
// the push's error, as the server answers it) and hand the parse on.
#ifndef ADAPS_TESTS_SERVER_PARSED_PUSH_H_
#define ADAPS_TESTS_SERVER_PARSED_PUSH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/optimizer.h"
#include "common/wire_codec.h"
#include "server/shard.h"
#include "server/sparse_answer.h"

namespace adaps {

inline absl::Status AddPushBytes(Shard& shard, int worker, uint64_t step,
                                 absl::Span<const uint8_t> bytes, int backup_workers = 0,
                                 bool step_each_push = false) {
  absl::StatusOr<ParsedUpdate> push = ParseUpdate(bytes);
  if (!push.ok()) return push.status();
  return shard.AddPush(worker, step, *push, backup_workers, step_each_push);
}

inline absl::Status ApplyPushBytes(Shard& shard, absl::Span<const uint8_t> bytes,
                                   const OptimizerConfig& optimizer) {
  absl::StatusOr<ParsedUpdate> push = ParseUpdate(bytes);
  if (!push.ok()) return push.status();
  return shard.ApplyPush(*push, optimizer);
}

inline absl::Status AddPushBytes(SparseAnswer& answer, int worker,
                                 absl::Span<const uint8_t> bytes, uint32_t length,
                                 absl::Span<float> agg) {
  absl::StatusOr<ParsedUpdate> push = ParseUpdate(bytes);
  if (!push.ok()) return push.status();
  return answer.AddPush(worker, *push, length, agg);
}

}  // namespace adaps

#endif  // ADAPS_TESTS_SERVER_PARSED_PUSH_H_
