// Splitting a training set over data-parallel workers: every worker gets a disjoint share
// (together they cover the set, or its first `limit` images of a seeded permutation), and
// walks its share in a fresh seeded order each epoch.
//
// Thread-safety: the functions keep no state; a ShardSampler is immutable after creation.
// Failure: kInvalidArgument for a worker count < 1 or a share smaller than one batch.
#ifndef ADAPS_WORKER_APP_TRAINER_SHARDING_H_
#define ADAPS_WORKER_APP_TRAINER_SHARDING_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace adaps::trainer {

// Shares of [0, n): a permutation of [0, n) drawn from `seed`, cut to its first `limit`
// elements when 0 < limit < n, split into `workers` contiguous parts whose sizes differ by
// at most one.
absl::StatusOr<std::vector<std::vector<uint32_t>>> ShardIndices(size_t n, int workers,
                                                                uint64_t seed, size_t limit = 0);

// One worker's share and its per-epoch order.
class ShardSampler {
 public:
  ShardSampler(std::vector<uint32_t> shard, uint64_t seed, int worker)
      : shard_(std::move(shard)), seed_(seed), worker_(worker) {}
  size_t size() const { return shard_.size(); }
  const std::vector<uint32_t>& shard() const { return shard_; }
  // The share in the order of epoch `epoch`; deterministic in (seed, worker, epoch).
  std::vector<uint32_t> EpochOrder(int epoch) const;

 private:
  std::vector<uint32_t> shard_;
  uint64_t seed_;
  int worker_;
};

}  // namespace adaps::trainer

#endif  // ADAPS_WORKER_APP_TRAINER_SHARDING_H_
