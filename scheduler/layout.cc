// The scheduler's tensor layouts and barriers: how a declared tensor is split into slices
// over the servers, and when a barrier is released. Part of scheduler/scheduler.h.
#include <algorithm>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_metrics.h"

namespace adaps {

absl::StatusOr<std::vector<SliceLayout>> SplitTensor(uint64_t length, uint32_t bin_size,
                                                     uint64_t split_threshold,
                                                     std::vector<uint64_t>& load) {
  ADAPS_RET_CHECK(length > 0, absl::StatusCode::kInvalidArgument, "tensor length is zero");
  ADAPS_RET_CHECK(bin_size > 0, absl::StatusCode::kInvalidArgument, "bin size is zero");
  ADAPS_RET_CHECK(!load.empty(), absl::StatusCode::kInvalidArgument, "no servers");
  const uint64_t nbins = (length + bin_size - 1) / bin_size;
  const size_t nservers = load.size();
  std::vector<size_t> order(nservers);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return load[a] < load[b]; });
  const uint64_t parts =
      length >= split_threshold ? std::min<uint64_t>(nservers, nbins) : uint64_t{1};
  std::vector<SliceLayout> slices;
  uint64_t bin = 0;
  for (uint64_t p = 0; p < parts; ++p) {
    // The first (nbins % parts) slices, which go to the least-loaded servers, get a bin more.
    const uint64_t bins = nbins / parts + (p < nbins % parts ? 1 : 0);
    const uint64_t begin = bin * bin_size;
    const uint64_t end = std::min(length, (bin + bins) * bin_size);
    bin += bins;
    ADAPS_RET_CHECK(end - begin <= UINT32_MAX, absl::StatusCode::kInvalidArgument,
                    "slice longer than 2^32-1 elements");
    SliceLayout s;
    s.offset = begin;
    s.length = static_cast<uint32_t>(end - begin);
    s.server = static_cast<int>(order[p]);
    load[order[p]] += uint64_t{s.length} * sizeof(float);
    slices.push_back(s);
  }
  std::sort(slices.begin(), slices.end(),
            [](const SliceLayout& a, const SliceLayout& b) { return a.offset < b.offset; });
  return slices;
}

void Scheduler::OnBarrier(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  if (env->sender_role() != msg::Role::Worker || Authenticated(in) == nullptr) {
    Reject(in, absl::FailedPreconditionError("barrier: not a known worker"),
           metric_labels::kReasonUnknownNode);
    return;
  }
  for (auto& n : nodes_) {
    if (n.role == msg::Role::Worker && n.rank == env->sender_rank()) n.barrier_seen = true;
  }
  barriers_[env->body_as_Barrier()->seq()].push_back(
      BarrierWaiter{in.route(), env->request_id(), env->sender_rank()});
  ReleaseBarriers();
}

void Scheduler::ReleaseBarriers() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (!formed_) return;  // a restarted scheduler waits until every node is back
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    int arrived = 0, expected = 0;
    for (const auto& n : nodes_) {
      if (n.role != msg::Role::Worker || !n.alive || n.left) continue;
      if (n.first_barrier > it->first) continue;  // joined while the others waited here
      if (!n.barrier_seen) continue;  // joined, and has not called a barrier yet
      ++expected;
      for (const auto& w : it->second) {
        if (w.rank == n.rank) {
          ++arrived;
          break;
        }
      }
    }
    if (arrived >= expected) {
      for (const auto& w : it->second) {
        transport_->SendRoute(w.route, MakeAck(transport_->self(), w.request_id));
      }
      next_barrier_ = std::max(next_barrier_, it->first + 1);
      it = barriers_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::OnDeclare(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  const msg::DeclareTensor* d = env->body_as_DeclareTensor();
  auto fail = [&](absl::Status s) {
    Reject(in, s, s.code() == absl::StatusCode::kFailedPrecondition
                      ? metric_labels::kReasonNotFormed
                      : metric_labels::kReasonInvalid);
  };
  if (!formed_) return fail(absl::FailedPreconditionError("cluster not complete yet"));
  if (d->name() == nullptr || d->name()->size() == 0) {
    return fail(absl::InvalidArgumentError("tensor name is empty"));
  }
  // A stranger declaring a tensor first (with another length) would break the real one.
  Node* sender = env->sender_role() == msg::Role::Worker ? Authenticated(in) : nullptr;
  if (sender == nullptr) {
    return Reject(in, absl::PermissionDeniedError("tensors are declared only by the job's workers"),
                  metric_labels::kReasonForbidden);
  }
  // A joiner takes part in the steps from its first declaration (the servers count it from
  // its declaration to them; a server restarted later, from its first view).
  sender->stepping = true;
  const std::string name = d->name()->str();
  auto it = layouts_.find(name);
  if (it == layouts_.end()) {
    auto slices = SplitTensor(d->length(), d->bin_size(), config_.split_threshold, server_load_);
    if (!slices.ok()) return fail(slices.status());
    Layout layout;
    layout.tensor_id = static_cast<uint32_t>(layouts_.size());
    layout.length = d->length();
    layout.bin_size = d->bin_size();
    layout.slices = *std::move(slices);
    it = layouts_.emplace(name, std::move(layout)).first;
    log_.get()->info("tensor '{}' ({} elements, bin {}) -> {} slice(s)", name, d->length(),
                     d->bin_size(), it->second.slices.size());
  } else if (it->second.length != d->length() || it->second.bin_size != d->bin_size()) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' already declared with length ", it->second.length, " and bin size ",
        it->second.bin_size, " (now ", d->length(), ", ", d->bin_size(), ")")));
  }
  const Layout& layout = it->second;
  flatbuffers::FlatBufferBuilder fbb(256);
  std::vector<msg::Slice> slices;
  for (const auto& s : layout.slices) slices.emplace_back(s.offset, s.length, s.server);
  auto body = msg::CreateTensorLayout(fbb, layout.tensor_id, fbb.CreateString(name),
                                      layout.length, layout.bin_size,
                                      fbb.CreateVectorOfStructs(slices));
  transport_->Reply(in, FinishEnvelope(fbb, transport_->self(), body, 0, env->request_id()));
}

}  // namespace adaps
