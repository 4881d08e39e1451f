#include "worker/app/trainer/sharding.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace adaps::trainer {
namespace {

// std::shuffle's result depends on the library; a Fisher-Yates over mt19937_64 does not.
void Shuffle(std::vector<uint32_t>& v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng() % i);
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace

absl::StatusOr<std::vector<std::vector<uint32_t>>> ShardIndices(size_t n, int workers,
                                                                uint64_t seed, size_t limit) {
  if (workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("worker count must be >= 1, got ", workers));
  }
  if (n > UINT32_MAX) return absl::InvalidArgumentError("data set too large to shard");
  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  Shuffle(all, seed ^ 0x9e3779b97f4a7c15ULL);
  if (limit > 0 && limit < n) all.resize(limit);
  if (all.size() < static_cast<size_t>(workers)) {
    return absl::InvalidArgumentError(
        absl::StrCat(all.size(), " images cannot be split over ", workers, " workers"));
  }
  std::vector<std::vector<uint32_t>> shards(workers);
  const size_t base = all.size() / workers;
  const size_t extra = all.size() % workers;
  size_t at = 0;
  for (int w = 0; w < workers; ++w) {
    const size_t len = base + (static_cast<size_t>(w) < extra ? 1 : 0);
    shards[w].assign(all.begin() + at, all.begin() + at + len);
    at += len;
  }
  return shards;
}

std::vector<uint32_t> ShardSampler::EpochOrder(int epoch) const {
  std::vector<uint32_t> order = shard_;
  Shuffle(order, seed_ * 1000003ULL + static_cast<uint64_t>(worker_) * 7919ULL +
                     static_cast<uint64_t>(epoch) + 1);
  return order;
}

}  // namespace adaps::trainer
