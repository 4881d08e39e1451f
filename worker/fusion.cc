// Fusion of small tensors (worker/fusion.h): declaring members into buckets and staging their
// Runs.
#include "worker/fusion.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/kinds.h"

namespace adaps {

FusionTable::FusionTable(const WorkerOptions& options, const RoleLog& log, Membership& membership,
                         Runner& runner, WorkerMetrics& metrics)
    : options_(options), log_(log), membership_(membership), runner_(runner), metrics_(metrics) {}

bool FusionTable::Takes(const TensorSpec& spec, uint64_t length) const {
  return spec.fuse && !spec.pull_in_place &&
         length * sizeof(float) < options_.fusion_threshold_bytes &&
         length <= kFusionCapacity;
}

std::vector<FusionBucket*> FusionTable::Buckets() {
  absl::MutexLock lock(&mu_);
  std::vector<FusionBucket*> buckets;
  for (const auto& b : buckets_) buckets.push_back(b.get());
  return buckets;
}

std::vector<Tensor*> FusionTable::ResidueHolders() {
  std::vector<Tensor*> holders;
  for (FusionBucket* b : Buckets()) {
    absl::MutexLock lock(&b->mu);  // (members is read-only once the bucket closed)
    if (b->closed && std::any_of(b->members.begin(), b->members.end(), [](const auto& m) {
          return m.t->spec.compression != Compression::kDense;
        })) {
      holders.push_back(&b->internal);
    }
  }
  return holders;
}

void FusionTable::Close() {
  absl::MutexLock lock(&mu_);
  for (FusionBucket*& open : open_bucket_) open = nullptr;  // they keep their members
}

absl::StatusOr<FusionBucket*> FusionTable::OpenBucket(const Tensor& t) {
  const int format = static_cast<int>(t.spec.pull);  // one open bucket per pull format
  size_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    FusionBucket* open = open_bucket_[format];
    if (open != nullptr) {
      absl::MutexLock bucket_lock(&open->mu);
      // (Members share the bucket's downlink divisor and keep_sum: another one opens a new
      // bucket.)
      if (!open->closed && open->internal.length + t.length <= kFusionCapacity &&
          open->internal.spec.pull_bin_divisor == t.spec.pull_bin_divisor &&
          open->internal.spec.keep_sum == t.spec.keep_sum) {
        return open;
      }
    }
    if (fusion_off_) return nullptr;
    seq = buckets_.size();
  }
  auto b = std::make_unique<FusionBucket>();
  Tensor& in = b->internal;
  in.spec.name = absl::StrCat(kFusionPrefix, seq);
  in.spec.shape = {kFusionCapacity};
  in.spec.bin_size = 1;
  in.spec.pull = t.spec.pull;
  in.spec.pull_bin_divisor = t.spec.pull_bin_divisor;
  in.spec.keep_sum = t.spec.keep_sum;
  in.bucket = b.get();
  flatbuffers::FlatBufferBuilder fbb(256);
  auto body = msg::CreateDeclareTensor(fbb, fbb.CreateString(in.spec.name), kFusionCapacity, 1);
  ADAPS_ASSIGN_OR_RETURN(InMessage reply, membership_.CallScheduler(fbb, body));
  const msg::TensorLayout* layout = reply.envelope()->body_as_TensorLayout();
  ADAPS_RET_CHECK(layout != nullptr && layout->slices() != nullptr &&
                      layout->length() == kFusionCapacity,
                  absl::StatusCode::kDataLoss, "bad tensor layout from the scheduler");
  if (layout->slices()->size() != 1) {
    log_.get()->warn("fusion off: the scheduler splits a bucket of {} elements over {} slices "
                     "(its --split_threshold is below that)",
                     kFusionCapacity, layout->slices()->size());
    absl::MutexLock lock(&mu_);
    fusion_off_ = true;
    return nullptr;
  }
  const msg::Slice* s = layout->slices()->Get(0);
  ADAPS_RET_CHECK(s->server() >= 0 && s->server() < membership_.num_servers(),
                  absl::StatusCode::kDataLoss, "bad slice in the tensor layout");
  in.tensor_id = layout->tensor_id();
  ADAPS_ASSIGN_OR_RETURN(uint64_t key, SliceKey(in.tensor_id, 0));
  in.meta.push_back(SliceMeta{SliceInfo{0, 0, s->server()}, key});
  {
    absl::MutexLock lock(&in.mu);
    in.slices.emplace_back();
  }
  metrics_.Attach(in);
  FusionBucket* raw = b.get();
  absl::MutexLock lock(&mu_);
  buckets_.push_back(std::move(b));
  open_bucket_[format] = raw;
  return raw;
}

absl::StatusOr<std::unique_ptr<Tensor>> FusionTable::NewMember(const TensorSpec& spec,
                                                               uint64_t length) {
  ADAPS_ASSIGN_OR_RETURN(auto compressor, MakeTensorCompressor(spec));
  auto t = std::make_unique<Tensor>();
  t->spec = spec;
  t->length = length;
  absl::MutexLock lock(&t->mu);  // not shared yet; held for the annotations only
  t->compressor = std::move(compressor);
  SliceRt rt;
  if (spec.compression != Compression::kDense) rt.residue = std::make_unique<SliceState>(length);
  t->slices.push_back(std::move(rt));
  return t;
}

absl::Status FusionTable::Declare(Tensor& t, absl::Span<float> values, bool* fused) {
  *fused = false;
  ADAPS_ASSIGN_OR_RETURN(FusionBucket * b, OpenBucket(t));
  if (b == nullptr) return absl::OkStatus();
  Tensor& in = b->internal;
  const uint64_t offset = in.length;
  const uint32_t length = static_cast<uint32_t>(t.length);
  std::vector<WireSegment> table = SegmentTable(*b);
  table.push_back(WireSegment{length, t.spec.bin_size});
  const SliceMeta& m = in.meta[0];
  SharedBytes init;
  if (membership_.rank() == 0) init = FloatsToBytes(values);
  ADAPS_RETURN_IF_ERROR(membership_.CallServerResuming(
      m.info.server,
      [&](flatbuffers::FlatBufferBuilder& fbb) {
        std::vector<msg::Segment> segs;
        for (const WireSegment& seg : table) segs.emplace_back(seg.length, seg.bin_size);
        return msg::CreateDeclareSlice(
            fbb, m.key, fbb.CreateString(in.spec.name), kFusionCapacity, 1, membership_.rank() == 0,
            fbb.CreateString(membership_.Secret()), fbb.CreateVectorOfStructs(segs),
            WirePullFormat(in.spec.pull), in.spec.pull_bin_divisor, in.spec.keep_sum);
      },
      init).status());
  if (!membership_.rejoined()) ADAPS_RETURN_IF_ERROR(membership_.Barrier());
  uint64_t incarnation = 0;
  membership_.links().Peer(m.info.server, &incarnation);
  // The bucket so far as this worker holds it: a later member pulls only its own elements
  // (from `offset`), unless the bucket moved on or its server restarted since; pulling the
  // whole bucket for each member would cost k^2 / 2 members' bytes for k of them.
  uint64_t held_step = 0, held_replica_version = 0, held_incarnation = 0;
  if (offset > 0) {
    absl::MutexLock lock(&in.mu);
    const SliceRt& rt = in.slices[0];
    held_step = rt.step;
    held_replica_version = rt.replica_version;
    held_incarnation = rt.incarnation;
  }
  // (Asked again of a server that restarts meanwhile, as Runner::PullDense does.)
  auto pull = [&](uint64_t from, msg::PullFormat format) {
    return membership_.CallServerResuming(m.info.server, [&](flatbuffers::FlatBufferBuilder& fbb) {
      return msg::CreatePullRequest(fbb, m.key, 0, 0, format, 0, from);
    });
  };
  const msg::PullFormat initial = ReplicaFormat(in.spec.pull);
  ADAPS_ASSIGN_OR_RETURN(InMessage r, pull(offset, initial));
  if (offset > 0) {
    const msg::PullResponse* got = r.envelope()->body_as_PullResponse();
    if (got == nullptr || got->offset() != offset || got->version() != held_step ||
        ReplicaVersion(*got) != held_replica_version || incarnation != held_incarnation) {
      ADAPS_ASSIGN_OR_RETURN(r, pull(0, initial));
    }
  }
  const uint64_t end = offset + length;
  const msg::PullResponse* resp = r.envelope()->body_as_PullResponse();
  const uint64_t from = resp != nullptr ? resp->offset() : 0;
  // (Another worker may have declared the next member already: the bucket is then longer.)
  ADAPS_RET_CHECK(resp != nullptr && (from == 0 || from == offset) &&
                      r.payload().size() % sizeof(float) == 0 &&
                      r.payload().size() >= (end - from) * sizeof(float),
                  absl::StatusCode::kDataLoss, "bad initial pull of a fusion bucket");
  // A joiner of a keep_sum bucket starts from the servers' running sum, at the version of
  // the answer above (the bucket's server counts the joiner from its declaration, so no
  // step completes in between unless --backup_workers lets one: kUnavailable, join again).
  const InMessage* start = &r;
  InMessage sum;
  if (membership_.rejoined() && JoinsFromSum(in.spec)) {
    ADAPS_ASSIGN_OR_RETURN(sum, pull(offset, msg::PullFormat::Replica));
    const msg::PullResponse* got = sum.envelope()->body_as_PullResponse();
    ADAPS_RET_CHECK(got != nullptr && got->offset() == offset &&
                        sum.payload().size() >= uint64_t{length} * sizeof(float),
                    absl::StatusCode::kDataLoss, "bad running sum pull of a fusion bucket");
    if (got->version() != resp->version()) {
      return absl::UnavailableError(absl::StrCat(
          "tensor '", t.spec.name, "': its fusion bucket stepped while this worker joined; "
          "join again"));
    }
    start = &sum;
  }
  const uint64_t start_from = start == &r ? from : offset;
  std::memcpy(values.data(), start->payload().data() + (offset - start_from) * sizeof(float),
              uint64_t{length} * sizeof(float));
  {
    absl::MutexLock lock(&b->mu);
    b->members.push_back(FusionBucket::Member{&t, offset, length});
  }
  {
    absl::MutexLock lock(&in.mu);
    in.length = end;
    in.spec.shape = {static_cast<int64_t>(end)};
    in.meta[0].info.length = static_cast<uint32_t>(end);
    SliceRt& rt = in.slices[0];
    if (KeepsReplica(in.spec.pull)) {
      // (An answer from `offset` extends the replica the earlier members' pulls made.)
      ADAPS_RET_CHECK(from <= rt.replica.size() && rt.GrowReplica(end),
                      absl::StatusCode::kInternal,
                      "a fusion bucket's replica is shorter than its members");
      std::memcpy(rt.replica.data() + from, r.payload().data(), (end - from) * sizeof(float));
    } else {
      rt.SetReplica(0);
    }
    rt.replica_version = ReplicaVersion(*resp);
    rt.step = resp->version();
    rt.seen_version = resp->version();
    rt.incarnation = incarnation;
  }
  if (offset == 0) runner_.Track(&in);  // (the bucket's first member)
  t.tensor_id = in.tensor_id;
  t.meta.push_back(SliceMeta{SliceInfo{0, length, m.info.server}, m.key});
  t.fused_into = b;
  t.fusion_index = b->members.size() - 1;
  *fused = true;
  return absl::OkStatus();
}

std::future<absl::Status> FusionTable::Run(Tensor& member, absl::Span<const float> grad,
                                           absl::Span<float> out, bool push, bool pull) {
  FusionBucket& b = *member.fused_into;
  const size_t i = member.fusion_index;
  std::shared_ptr<FusionBatch> batch;
  std::future<absl::Status> future;
  {
    absl::MutexLock lock(&b.mu);
    b.closed = true;
    const FusionBucket::Member& m = b.members[i];
    if (b.given > 0 && (b.push != push || b.pull != pull)) {
      return ReadyFuture(absl::FailedPreconditionError(absl::StrCat(
          "tensor '", member.spec.name, "' is fused with others (bucket ", b.internal.spec.name,
          ") that were given another operation in this step: give every member the same "
          "one (PushPull, Push or Pull)")));
    }
    if (b.given == 0) {
      b.staged = std::make_shared<FusionBatch>();
      b.staged->promises.resize(b.members.size());
      b.staged->outs.resize(b.members.size());
      b.staged->given.assign(b.members.size(), false);
      if (push) b.staged->grad.resize(b.internal.length);
      if (pull) b.staged->out.resize(b.internal.length);
      b.push = push;
      b.pull = pull;
      b.deadline = absl::Now() + options_.request_timeout;
    }
    FusionBatch& s = *b.staged;
    if (s.given[i]) {
      return ReadyFuture(absl::FailedPreconditionError(absl::StrCat(
          "tensor '", member.spec.name, "' was given again before its fusion bucket ",
          b.internal.spec.name, " was complete: every member must be given once per step")));
    }
    s.given[i] = true;
    if (push) std::copy(grad.begin(), grad.end(), s.grad.begin() + m.offset);
    s.outs[i] = out;
    future = s.promises[i].get_future();
    if (++b.given < static_cast<int>(b.members.size())) return future;
    batch = std::move(b.staged);
    b.given = 0;
  }
  if (pull) {
    for (const FusionBucket::Member& each : b.members) {
      absl::MutexLock lock(&each.t->mu);
      ++each.t->traffic.pulls;
      each.t->traffic.pull_dense_bytes += uint64_t{each.length} * sizeof(float);
    }
  }
  runner_.Run(b.internal, batch->grad, absl::MakeSpan(batch->out), push, pull,
              [batch, &b, pull](const absl::Status& status) {
                for (size_t k = 0; k < batch->promises.size(); ++k) {
                  if (status.ok() && pull) {
                    const FusionBucket::Member& each = b.members[k];
                    std::memcpy(batch->outs[k].data(), batch->out.data() + each.offset,
                                uint64_t{each.length} * sizeof(float));
                  }
                  batch->promises[k].set_value(status);
                }
              });
  return future;
}

void FusionTable::Expire() {
  const std::vector<FusionBucket*> buckets = Buckets();
  const absl::Time now = absl::Now();
  for (FusionBucket* b : buckets) {
    std::shared_ptr<FusionBatch> expired;
    std::vector<std::string> missing;
    {
      absl::MutexLock lock(&b->mu);
      if (b->given == 0 || now < b->deadline) continue;
      expired = std::move(b->staged);
      b->given = 0;
      for (size_t k = 0; k < b->members.size(); ++k) {
        if (!expired->given[k]) missing.push_back(b->members[k].t->spec.name);
      }
    }
    const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
        "fusion bucket ", b->internal.spec.name, " was not complete within the request "
        "timeout: tensor(s) ", absl::StrJoin(missing, ", "), " not given in this step"));
    log_.get()->warn("{}", std::string(status.message()));
    for (size_t k = 0; k < expired->promises.size(); ++k) {
      if (expired->given[k]) expired->promises[k].set_value(status);
    }
  }
}

void FusionTable::FailStaged(const absl::Status& status) {
  for (FusionBucket* b : Buckets()) {
    std::shared_ptr<FusionBatch> staged;
    {
      absl::MutexLock lock(&b->mu);
      staged = std::move(b->staged);
      b->given = 0;
    }
    if (staged == nullptr) continue;
    for (size_t k = 0; k < staged->promises.size(); ++k) {
      if (staged->given[k]) staged->promises[k].set_value(status);
    }
  }
}

}  // namespace adaps
