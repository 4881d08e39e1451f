// Bad input against real processes: a raw ZeroMQ client sends garbage, truncated frames,
// another protocol version, huge claimed lengths, unknown tensors, wrong lengths, NaN and
// Inf gradients (dense and sparse payloads) and forged scheduler messages to a real
// adaps-server and adaps-scheduler. Each gets a clear error or is dropped, the processes
// stay up, and pulling afterwards shows that no parameter changed.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

#include "adaps/worker.h"
#include "common/compressor.h"
#include "common/messages.h"
#include "common/wire_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/raw_client.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace adaps {
namespace {

using ::adaps::testing::ClusterOptions;
using ::adaps::testing::LocalCluster;
using ::adaps::testing::WaitForPortFile;
using ::testing::HasSubstr;

constexpr size_t kLen = 100;

float Init(size_t i) { return static_cast<float>(i) * 0.5f; }

using testing::RawAnswer;
using testing::RawClient;

const Sender kWorker0{msg::Role::Worker, 0};

OutMessage PushMessage(uint64_t key, msg::PayloadKind kind, SharedBytes payload, uint64_t id,
                       uint64_t step = 0) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreatePush(fbb, key, step, kind);
  return FinishEnvelope(fbb, kWorker0, body, id, 0, std::move(payload));
}

SharedBytes Encode(const CompressedUpdate& u) {
  auto bytes = std::make_shared<Bytes>();
  EXPECT_TRUE(EncodeUpdate(u, IndexCoding::kRice, bytes.get()).ok());
  return bytes;
}

SharedBytes DenseBytes(size_t n, float value) {
  CompressedUpdate u;
  u.kind = CompressorKind::kDense;
  u.length = static_cast<uint32_t>(n);
  u.values.assign(n, value);
  return Encode(u);
}

// A valid AdaComp encoding of `kLen` elements whose scale is then overwritten by `scale`.
SharedBytes AdaCompWithScale(float scale) {
  std::vector<float> g(kLen);
  for (size_t i = 0; i < kLen; ++i) g[i] = (i % 7 == 0) ? 1.0f : 0.01f;
  CompressorOptions o;
  o.kind = CompressorKind::kAdaComp;
  o.bin_size = 10;
  auto c = MakeCompressor(o);
  SliceState state(kLen);
  CompressedUpdate u;
  EXPECT_TRUE((*c)->Compress(g, state, u).ok());
  auto bytes = std::make_shared<Bytes>(*Encode(u));
  // Find the encoded scale (the first f32 after the varints) and replace it.
  const float s = u.scale;
  for (size_t off = 4; off + 4 <= bytes->size(); ++off) {
    if (std::memcmp(bytes->data() + off, &s, 4) == 0) {
      std::memcpy(bytes->data() + off, &scale, 4);
      return bytes;
    }
  }
  ADD_FAILURE() << "scale not found in the encoding";
  return bytes;
}

}  // namespace

// The server is started here rather than by the harness so that it writes a port file and
// has a checkpoint directory.
TEST(HostileInput, GarbageTruncatedVersionLengthsNanInfAndForgeriesChangeNothing) {
  ClusterOptions c;
  c.num_servers = 0;  // the server is started below, with a port file
  c.num_workers = 1;
  c.scheduler_args = {"--num_servers=1"};
  LocalCluster cluster(c);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  const std::string port_file = cluster.dir() + "/server.port";
  testing::Process server(ADAPS_SERVER_BIN,
                          {"--scheduler=" + cluster.scheduler_address(), "--optimizer=sum",
                           "--log_level=warn", "--port_file=" + port_file,
                           "--checkpoint_dir=" + cluster.dir()},
                          cluster.dir() + "/server.log");
  WorkerOptions o;
  o.scheduler = cluster.scheduler_address();
  o.register_timeout = absl::Seconds(20);
  o.request_timeout = absl::Seconds(5);
  o.log_level = "warn";
  o.fusion_threshold_bytes = 0;  // the hostile client sends its own messages to plain slices
  auto w = Worker::Create(o);
  ASSERT_TRUE(w.ok()) << w.status();
  Worker& worker = **w;
  const std::string port = WaitForPortFile(port_file, absl::Seconds(10));
  ASSERT_FALSE(port.empty()) << server.Log();
  std::vector<float> d(kLen), a(kLen);
  for (size_t i = 0; i < kLen; ++i) d[i] = a[i] = Init(i);
  ASSERT_TRUE(worker.Declare({"d", {kLen}, 10, Compression::kDense}, absl::MakeSpan(d)).ok());
  ASSERT_TRUE(worker.Declare({"a", {kLen}, 10, Compression::kAdaComp}, absl::MakeSpan(a)).ok());
  auto slices = worker.Slices("d");
  ASSERT_TRUE(slices.ok());
  // Tensors 0 and 1 (declared in this order), one slice each.
  const uint64_t dense_key = *SliceKey(0, 0), ada_key = *SliceKey(1, 0);

  zmq::context_t ctx(1);
  RawClient raw(ctx, "tcp://127.0.0.1:" + port);
  RawClient sched(ctx, cluster.scheduler_address());
  uint64_t id = 1000;
  const absl::Duration kDropWait = absl::Milliseconds(300);

  auto expect_error = [&](const OutMessage& m, uint64_t rid, absl::StatusCode code,
                          const std::string& what, RawClient* to = nullptr) {
    RawAnswer ans = (to ? to : &raw)->Exchange(m, rid);
    ASSERT_TRUE(ans.answered) << what << ": no answer";
    ASSERT_EQ(ans.body, msg::Body::Error) << what;
    EXPECT_EQ(ans.status.code(), code) << what << ": " << ans.status;
    EXPECT_FALSE(ans.status.message().empty()) << what;
  };

  // 1. Garbage, empty and extra frames: dropped without an answer.
  raw.SendFrames({"definitely not a flatbuffer"});
  raw.SendFrames({""});
  raw.SendFrames({std::string(100000, '\xff')});
  {
    ++id;
    OutMessage m = PushMessage(dense_key, msg::PayloadKind::Dense, DenseBytes(kLen, 1.0f), id);
    std::string header(reinterpret_cast<const char*>(m.header.data()), m.header.size());
    raw.SendFrames({header, std::string(m.payload->begin(), m.payload->end()), "third"});
    EXPECT_FALSE(raw.Wait(id, kDropWait).answered) << "three frames";
    ++id;
    OutMessage t = PushMessage(dense_key, msg::PayloadKind::Dense, DenseBytes(kLen, 1.0f), id);
    std::string cut(reinterpret_cast<const char*>(t.header.data()), t.header.size() / 2);
    raw.SendFrames({cut, std::string(t.payload->begin(), t.payload->end())});
    EXPECT_FALSE(raw.Wait(id, kDropWait).answered) << "truncated header";
    ++id;
    OutMessage p = PushMessage(dense_key, msg::PayloadKind::Dense, DenseBytes(kLen, 1.0f), id);
    auto payload = std::string(p.payload->begin(), p.payload->end());
    raw.SendFrames({std::string(reinterpret_cast<const char*>(p.header.data()), p.header.size()),
                    payload.substr(0, payload.size() - 7)});
    EXPECT_FALSE(raw.Wait(id, kDropWait).answered) << "truncated payload frame";
  }
  // 2. Huge claimed lengths: in the envelope (payload_size 2^60) and in the payload (a dense
  //    update claiming 2^31 elements, carrying 400 bytes).
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = msg::CreatePush(fbb, dense_key, 0, msg::PayloadKind::Dense);
    msg::EnvelopeBuilder eb(fbb);
    eb.add_version(kProtocolVersion);
    eb.add_sender_role(msg::Role::Worker);
    eb.add_sender_rank(0);
    eb.add_request_id(++id);
    eb.add_payload_size(uint64_t{1} << 60);
    eb.add_body_type(msg::Body::Push);
    eb.add_body(body.Union());
    fbb.Finish(eb.Finish());
    OutMessage m{fbb.Release(), DenseBytes(kLen, 1.0f)};
    raw.Send(m);
    EXPECT_FALSE(raw.Wait(id, kDropWait).answered) << "payload_size 2^60";
    auto claim = std::make_shared<Bytes>(*DenseBytes(kLen, 1.0f));
    // Replace the one-byte varint length (100) with the five-byte varint of 2^31.
    ASSERT_EQ((*claim)[4], kLen);
    claim->erase(claim->begin() + 4);
    const uint8_t big[] = {0x80, 0x80, 0x80, 0x80, 0x08};
    claim->insert(claim->begin() + 4, big, big + 5);
    ++id;
    RawAnswer ans = raw.Exchange(PushMessage(dense_key, msg::PayloadKind::Dense, claim, id), id);
    ASSERT_TRUE(ans.answered);
    EXPECT_TRUE(ans.status.code() == absl::StatusCode::kInvalidArgument ||
                ans.status.code() == absl::StatusCode::kDataLoss)
        << ans.status;
  }
  // 3. Another protocol version: a clear FAILED_PRECONDITION naming both versions.
  for (RawClient* to : {&raw, &sched}) {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = msg::CreatePullRequest(fbb, dense_key, 0, 0, msg::PullFormat::Dense);
    msg::EnvelopeBuilder eb(fbb);
    eb.add_version(kProtocolVersion + 1);
    eb.add_request_id(++id);
    eb.add_body_type(msg::Body::PullRequest);
    eb.add_body(body.Union());
    fbb.Finish(eb.Finish());
    RawAnswer ans = to->Exchange(OutMessage{fbb.Release(), nullptr}, id);
    ASSERT_TRUE(ans.answered);
    EXPECT_EQ(ans.status.code(), absl::StatusCode::kFailedPrecondition) << ans.status;
    EXPECT_THAT(std::string(ans.status.message()), HasSubstr("protocol version"));
  }
  // 4. Unknown tensor, wrong lengths, kind mismatch.
  ++id;
  expect_error(PushMessage(777, msg::PayloadKind::Dense, DenseBytes(kLen, 1.0f), id), id,
               absl::StatusCode::kInvalidArgument, "unknown slice");
  ++id;
  expect_error(PushMessage(dense_key, msg::PayloadKind::Dense, DenseBytes(kLen + 1, 1.0f), id),
               id, absl::StatusCode::kInvalidArgument, "wrong length");
  ++id;
  expect_error(PushMessage(ada_key, msg::PayloadKind::AdaComp, DenseBytes(kLen, 1.0f), id),
               id, absl::StatusCode::kInvalidArgument, "kind mismatch");
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = msg::CreatePullRequest(fbb, 4242, 0, 0, msg::PullFormat::Dense);
    ++id;
    expect_error(FinishEnvelope(fbb, kWorker0, body, id, 0), id,
                 absl::StatusCode::kInvalidArgument, "pull of unknown slice");
  }
  {
    // A pull from an offset: past the slice's end, or in a format that has no offset.
    flatbuffers::FlatBufferBuilder fbb;
    auto body =
        msg::CreatePullRequest(fbb, dense_key, 0, 0, msg::PullFormat::Dense, 0, kLen + 1);
    ++id;
    expect_error(FinishEnvelope(fbb, kWorker0, body, id, 0), id, absl::StatusCode::kOutOfRange,
                 "pull from past the end");
    flatbuffers::FlatBufferBuilder fbb2;
    auto sparse = msg::CreatePullRequest(fbb2, dense_key, 0, 0, msg::PullFormat::Sparse, 0, 2);
    ++id;
    expect_error(FinishEnvelope(fbb2, kWorker0, sparse, id, 0), id,
                 absl::StatusCode::kInvalidArgument, "sparse pull from an offset");
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = msg::CreateDeclareSlice(fbb, dense_key, fbb.CreateString("d"), kLen + 5, 10, false);
    ++id;
    // A stranger (no worker secret) is refused before the declaration is looked at.
    expect_error(FinishEnvelope(fbb, kWorker0, body, id, 0), id,
                 absl::StatusCode::kPermissionDenied, "redeclare with another length");
  }
  // 5. NaN and Inf: dense values, the AdaComp scale, a Top-k value, initial values.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {nan, inf, -inf}) {
    auto dense = std::make_shared<Bytes>(*DenseBytes(kLen, 1.0f));
    std::memcpy(dense->data() + dense->size() - 8, &bad, 4);  // one element near the end
    ++id;
    expect_error(PushMessage(dense_key, msg::PayloadKind::Dense, dense, id), id,
                 absl::StatusCode::kInvalidArgument, "non-finite dense value");
    ++id;
    expect_error(PushMessage(ada_key, msg::PayloadKind::AdaComp, AdaCompWithScale(bad), id),
                 id, absl::StatusCode::kInvalidArgument, "non-finite AdaComp scale");
    CompressedUpdate u;
    u.kind = CompressorKind::kTopK;
    u.length = kLen;
    u.indices = {3, 50};
    u.values = {1.0f, bad};
    ++id;
    expect_error(PushMessage(dense_key, msg::PayloadKind::TopK, Encode(u), id), id,
                 absl::StatusCode::kInvalidArgument, "non-finite Top-k value");
    std::vector<float> init(16, 1.0f);
    init[7] = bad;
    flatbuffers::FlatBufferBuilder fbb;
    auto body = msg::CreateDeclareSlice(fbb, 99, fbb.CreateString("new"), 16, 4, true);
    ++id;
    expect_error(FinishEnvelope(fbb, kWorker0, body, id, 0, FloatsToBytes(init)), id,
                 absl::StatusCode::kPermissionDenied, "non-finite initial value (stranger)");
  }
  // 6. Forgeries: scheduler messages on the server's port, a checkpoint elsewhere.
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = msg::CreateShutdown(fbb, fbb.CreateString("forged"));
    ++id;
    expect_error(FinishEnvelope(fbb, Sender{msg::Role::Scheduler, 0}, body, id, 0), id,
                 absl::StatusCode::kPermissionDenied, "forged shutdown");
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<flatbuffers::Offset<msg::NodeInfo>> nodes = {msg::CreateNodeInfo(
        fbb, msg::Role::Worker, 0, fbb.CreateString(""), fbb.CreateString(""), false)};
    auto body = msg::CreateClusterView(fbb, 0, 1, 1, 1000, fbb.CreateVector(nodes), 100);
    ++id;
    expect_error(FinishEnvelope(fbb, Sender{msg::Role::Scheduler, 0}, body, id, 0), id,
                 absl::StatusCode::kPermissionDenied, "forged cluster view");
  }
  {
    const std::string elsewhere = cluster.dir() + "/elsewhere";
    flatbuffers::FlatBufferBuilder fbb;
    auto body = msg::CreateCheckpoint(fbb, fbb.CreateString(elsewhere));
    ++id;
    expect_error(FinishEnvelope(fbb, kWorker0, body, id, 0), id,
                 absl::StatusCode::kPermissionDenied, "checkpoint elsewhere");
  }
  // 7. The scheduler: garbage and an oversized frame are dropped, a malformed declaration
  //    is answered with an error.
  sched.SendFrames({"junk"});
  sched.SendFrames({std::string(4 << 20, 'x')});
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = msg::CreateDeclareTensor(fbb, fbb.CreateString(""), 10, 0);
    ++id;
    expect_error(FinishEnvelope(fbb, kWorker0, body, id, 0), id,
                 absl::StatusCode::kInvalidArgument, "empty tensor name", &sched);
  }

  // Nothing changed; both processes are up and a real step still works.
  EXPECT_EQ(server.WaitExit(absl::ZeroDuration()), -1) << server.Log();
  EXPECT_EQ(cluster.scheduler().WaitExit(absl::ZeroDuration()), -1);
  for (const char* name : {"d", "a"}) {
    std::vector<float> out(kLen, -1.0f);
    ASSERT_TRUE(worker.Pull(name, absl::MakeSpan(out)).get().ok()) << name;
    for (size_t i = 0; i < kLen; ++i) ASSERT_EQ(out[i], Init(i)) << name << "[" << i << "]";
  }
  std::vector<float> g(kLen, 1.0f), out(kLen);
  ASSERT_TRUE(worker.PushPull("d", g, absl::MakeSpan(out)).get().ok());
  for (size_t i = 0; i < kLen; ++i) ASSERT_EQ(out[i], Init(i) + 1.0f) << i;
  EXPECT_TRUE(worker.Stop().ok());
  EXPECT_EQ(server.WaitExit(absl::Seconds(10)), 0) << server.Log();
  EXPECT_EQ(cluster.scheduler().WaitExit(absl::Seconds(10)), 0);
}

}  // namespace adaps
