// Sparse pulls of a shard (server/shard.h, schemas/README.md "Sparse pulls"): the elements
// each tracked step touched, and the step's smallest exact answer (the merged list of new
// values, or a mean step's pushes forwarded), encoded once per version.
#include <algorithm>
#include <iterator>
#include <memory>
#include <vector>

#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "server/shard.h"

namespace adaps {

void Shard::CollectTouched() {
  if (touched_pending_) {
    touched_.clear();
    for (size_t w = 0; w < touched_bits_.size(); ++w) {
      uint64_t bits = touched_bits_[w];
      if (bits == 0) continue;
      touched_bits_[w] = 0;
      const uint32_t base = static_cast<uint32_t>(w * 64);
      do {
        touched_.push_back(base + static_cast<uint32_t>(__builtin_ctzll(bits)));
        bits &= bits - 1;
      } while (bits != 0);
    }
  }
  touched_pending_ = false;
}

// The smallest exact sparse answer, kept only when smaller than the dense one: the new
// values at the elements the step touched, as one Top-k encoding (one merged ascending index
// list, Rice-coded gaps, float32 values; exact whatever the optimizer's rounding, since the
// worker assigns the server's own floats), or, for a mean or SGD step, the step's pushes
// forwarded as they came (their sign bits against 32-bit values: about W times smaller at
// AdaComp's densities; exact because the worker replays the same float operations in the
// same order, an SGD step's with the rate the server used).
absl::Status Shard::PublishSparse() {
  sparse_version_ = version_;
  sparse_forwarded_ = false;
  forwarded_without_.clear();
  // The last version's buffer, written again once whoever sends it released it (Reusable).
  if (sparse_bytes_) sparse_spare_ = std::move(sparse_bytes_);
  if (!last_sparse_) return absl::OkStatus();
  const uint64_t dense = uint64_t{length_} * sizeof(float);
  uint64_t forwarded = UINT64_MAX;
  if (last_forwardable_ && (last_sgd_ || mean_zero_outside_) && last_push_count_ > 0) {
    forwarded = 12;
    for (size_t i = 0; i < last_push_count_; ++i) forwarded += 4 + last_pushes_[i].size();
  }
  std::shared_ptr<std::vector<uint8_t>> bytes = Reusable(sparse_spare_);
  sparse_spare_.reset();
  // The merged list holds at least 4 bytes a value: encoded only when it may be the smallest.
  if (uint64_t{last_touched_.size()} * sizeof(float) < std::min(dense, forwarded)) {
    CompressedUpdate& u = sparse_update_;
    u.kind = CompressorKind::kTopK;
    u.length = length_;
    u.bin_size = 0;
    u.indices.assign(last_touched_.begin(), last_touched_.end());
    u.values.resize(last_touched_.size());
    for (size_t j = 0; j < last_touched_.size(); ++j) u.values[j] = params_[last_touched_[j]];
    // (A value the codec refuses, NaN or Inf, goes out in the dense answer as it is.)
    if (EncodeUpdate(u, IndexCoding::kRice, bytes.get()).ok() &&
        bytes->size() < std::min(dense, forwarded)) {
      sparse_bytes_ = std::move(bytes);
      return absl::OkStatus();
    }
  }
  if (forwarded < dense) {
    std::vector<absl::Span<const uint8_t>> pushes(last_pushes_.begin(),
                                                  last_pushes_.begin() + last_push_count_);
    if (EncodeForwardedFor(pushes, bytes.get(), -1).ok()) {
      sparse_bytes_ = std::move(bytes);
      sparse_forwarded_ = true;
      return absl::OkStatus();
    }
  }
  sparse_spare_ = std::move(bytes);
  return absl::OkStatus();
}

absl::Status Shard::EncodeForwardedFor(absl::Span<const absl::Span<const uint8_t>> pushes,
                                       std::vector<uint8_t>* out, int own) const {
  return last_sgd_ ? EncodeForwardedSgd(last_scale_, last_lr_, pushes, out, own)
                   : EncodeForwarded(last_scale_, pushes, out, own);
}

Shard::PayloadBytes Shard::ForwardedFor(const Pull& pull) {
  if (pull.worker < 0 || pull.held_push != version_) return sparse_bytes_;
  const auto own = std::find(last_push_workers_.begin(), last_push_workers_.end(), pull.worker);
  if (own == last_push_workers_.end()) return sparse_bytes_;
  for (const auto& [worker, bytes] : forwarded_without_) {
    if (worker == pull.worker) return bytes;
  }
  std::vector<absl::Span<const uint8_t>> pushes(last_pushes_.begin(),
                                                last_pushes_.begin() + last_push_count_);
  auto bytes = std::make_shared<std::vector<uint8_t>>();
  if (!EncodeForwardedFor(pushes, bytes.get(), static_cast<int>(own - last_push_workers_.begin()))
           .ok()) {
    return sparse_bytes_;  // (encoded once already: cannot fail)
  }
  forwarded_without_.emplace_back(pull.worker, bytes);
  return bytes;
}

}  // namespace adaps
