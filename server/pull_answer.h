// What a shard's answer kinds share (server/shard.h): a pull and its answer, the slice as
// an answer reads it at the current version, what a completed step tells the answers, and
// the dense answer, the simplest kind: the parameters as float32, encoded once per version.
//
// The answer kinds are parts of a `Shard` (docs/architecture.md "The server's shard"):
// DenseAnswer here, RecompressedAnswer (server/recompressed_answer.h) and SparseAnswer
// (server/sparse_answer.h). Each owns its own state and bytes; answer bytes are shared with
// whoever sends them and never changed while anyone else holds them (ReusableBytes).
// Thread-safety: none; the shard's thread (its engine thread) owns its parts.
#ifndef ADAPS_SERVER_PULL_ANSWER_H_
#define ADAPS_SERVER_PULL_ANSWER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/wire_codec.h"

namespace adaps {

// The same type as SharedBytes in common/messages.h (an immutable shared payload).
using PayloadBytes = std::shared_ptr<const std::vector<uint8_t>>;

// kReplica: the published replica of recompressed pulls as dense floats, the answer's base
// being the version it was published at and its version the shard's, as for a dense answer
// (nothing is published for it): the replica a worker takes when it declares or
// resynchronizes a tensor it pulls recompressed.
// kSparse: the step's exact change (schemas/README.md "Sparse pulls"): the new values at
// the elements some worker sent in the step, answered as kSparse, or as kDense when that
// is no larger or the only exact answer (the step was not tracked, or ran a dense
// optimizer, or the puller's replica is not at the version before).
// kForwarded: an answer format only (to a kSparse pull, when it is the smallest exact
// answer of a mean or SGD step): the step's pushes as they came, which the worker replays.
enum class AnswerFormat { kDense, kRecompressed, kReplica, kSparse, kForwarded };

// A pull waiting for (or being answered at) a version. `route` is opaque to the shard.
struct SlicePull {
  std::string route;
  uint64_t request_id = 0;
  uint64_t min_version = 0;
  uint64_t have_version = 0;
  AnswerFormat format = AnswerFormat::kDense;
  int peer = -1;  // opaque too: the route's alternative (a DEALER peer) when >= 0
  // The puller's rank (-1: unknown) and the step + 1 of its push to this slice that it
  // holds (0: none): a forwarded answer at the version that step made leaves it out.
  int worker = -1;
  uint64_t held_push = 0;
  // Dense and Replica: the answer holds the elements from here on (Shard::AnswerPull).
  uint64_t offset = 0;
};

// What a pull is answered with: the version it brings the puller to, the version the
// payload is a change from (recompressed; 0 for dense), and the payload (null: nothing
// new since have_version).
struct SliceAnswer {
  uint64_t version = 0;
  uint64_t base = 0;
  PayloadBytes payload;
  // What the payload is (a kSparse pull: kSparse, kForwarded or kDense).
  AnswerFormat format = AnswerFormat::kDense;
  bool zero_base = false;  // kSparse: the elements not listed are 0 (mean)
  uint64_t offset = 0;     // kDense, kReplica: the first element the payload holds
};

// The slice as its answers read it: at its current version, valid for one call.
struct SliceNow {
  absl::string_view name;  // for errors
  uint64_t version = 0;
  absl::Span<const float> params;
  uint32_t bin_size = 0;                    // a plain slice's (the downlink's bin)
  absl::Span<const WireSegment> segments;  // a fusion bucket's (empty: a plain slice)
};

// How the shard's version changed, told once per change to the answers that follow steps
// (SparseAnswer::OnStep): a completed sync step, an async push applied, or a restored shard
// going on at a later step (resume; nothing is known of that change).
struct StepResult {
  uint64_t version = 0;  // the version now
  // The change is known element by element: a tracked step whose optimizer changes only
  // the elements pushed to (SparseStepAllowed), at SparseAnswer's collected elements.
  bool sparse = false;
  bool mean = false;         // sparse: the optimizer was `mean`
  bool sgd_by_push = false;  // sparse: SGD stepped push by push (ApplySgdParts)
  float learning_rate = 0.0f;
  float scale = 1.0f;  // 1 / the pushes the step averaged
  // Every parameter outside the step's elements is 0 (a sparse mean step, and every sparse
  // step after it until a dense one).
  bool zero_outside = false;
};

// `bytes` if nobody else holds it (to overwrite it in place), else a new buffer.
std::shared_ptr<std::vector<uint8_t>> ReusableBytes(std::shared_ptr<std::vector<uint8_t>>& bytes);

// A Replica answer: `values` copied as dense float32 (not cached), at `version`, `base` the
// version of the state they hold.
SliceAnswer ReplicaAnswer(absl::Span<const float> values, uint64_t version, uint64_t base);

// The dense answer: the parameters as float32 at the current version, encoded once per
// version; the same bytes for every puller.
class DenseAnswer {
 public:
  // The answer at `now.version` (encoding it when this version was not yet).
  SliceAnswer Answer(const SliceNow& now);
  // The parameters changed without a new version (initial values): encode again.
  void Invalidate() { version_ = UINT64_MAX; }

 private:
  std::shared_ptr<std::vector<uint8_t>> bytes_;
  uint64_t version_ = UINT64_MAX;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_PULL_ANSWER_H_
