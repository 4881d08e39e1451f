#include "server/pull_answer.h"

#include <atomic>
#include <cstring>
#include <utility>

namespace adaps {

std::shared_ptr<std::vector<uint8_t>> ReusableBytes(std::shared_ptr<std::vector<uint8_t>>& bytes) {
  if (bytes && bytes.use_count() == 1) {
    // Whoever held it last released it (e.g. the transport after sending): see its reads
    // as done before we overwrite.
    std::atomic_thread_fence(std::memory_order_acquire);
    return bytes;
  }
  return std::make_shared<std::vector<uint8_t>>();
}

SliceAnswer ReplicaAnswer(absl::Span<const float> values, uint64_t version, uint64_t base) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(bytes->data(), values.data(), bytes->size());
  SliceAnswer answer;
  answer.payload = std::move(bytes);
  answer.format = AnswerFormat::kReplica;
  answer.version = version;
  answer.base = base;
  return answer;
}

SliceAnswer DenseAnswer::Answer(const SliceNow& now) {
  if (version_ != now.version || !bytes_) {
    std::shared_ptr<std::vector<uint8_t>> bytes = ReusableBytes(bytes_);
    bytes->resize(now.params.size() * sizeof(float));
    std::memcpy(bytes->data(), now.params.data(), bytes->size());
    bytes_ = std::move(bytes);
    version_ = now.version;
  }
  SliceAnswer answer;
  answer.version = now.version;
  answer.payload = bytes_;
  return answer;
}

}  // namespace adaps
