#include "server/declaration.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/recompressed_answer.h"

namespace adaps {

absl::StatusOr<DeclareWork> DeclarationWork(const msg::DeclareSlice& d,
                                            const DeclarationRules& rules) {
  const std::string name = d.name() ? d.name()->str() : "";
  const msg::PullFormat pull = d.pull_format();
  if (pull == msg::PullFormat::Recompressed && rules.backup_workers > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "recompressed pulls of '", name, "' cannot follow a straggler's replica, which skips "
        "the versions that completed without it (the servers run --backup_workers=",
        rules.backup_workers, "): declare it with pull=dense or pull=sparse"));
  }
  if (pull == msg::PullFormat::Sparse) {
    absl::Status sparse = rules.sync ? SparseStepAllowed(rules.optimizer)
                                     : absl::FailedPreconditionError(
                                           "the servers run asynchronously (--sync=false)");
    if (!sparse.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sparse pulls of '", name, "' need servers whose step changes only what the workers "
          "sent (--optimizer=mean, sum, or sgd without weight decay, in sync mode), but ",
          sparse.message(), ": declare it with pull=dense, or pull=recompressed"));
    }
  }
  const bool mean = rules.optimizer.kind == OptimizerKind::kMean;
  DeclareWork work;
  work.key = d.key();
  work.name = name;
  work.length = d.length();
  // The shard's bin size is its downlink's (pushes carry their own in every update).
  work.pull_bin_divisor = std::max<uint32_t>(1, d.pull_bin_divisor());
  work.bin_size = PullBinSize(d.bin_size(), rules.pull_bin_size, work.pull_bin_divisor);
  work.has_init = d.has_init();
  work.sparse_pulls = pull == msg::PullFormat::Sparse;
  // A running mean or sum: only a mean server's slices (others step their parameters
  // already); recompressed pulls' slice is the sum itself.
  work.recompressed_pulls = pull == msg::PullFormat::Recompressed && mean;
  work.keep_sum = d.keep_sum() && mean && pull != msg::PullFormat::Recompressed;
  if (d.segments() != nullptr && d.segments()->size() > 0) {
    for (const msg::Segment* seg : *d.segments()) {
      work.segments.push_back(WireSegment{seg->length(), seg->bin_size()});
    }
    work.downlink_bin_cap = rules.pull_bin_size;  // per member, at publishing
  }
  return work;
}

}  // namespace adaps
