// Writes the seed corpus of the messages fuzz target (fuzz_messages.cc): one valid message
// of every body type, in that target's input layout (u8 flags | u16 LE header length |
// header | payload), addressed to the fuzz target's slice 0 (64 floats). Run once; the
// seeds are committed under tests/fuzz/corpus/messages/.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/compressor.h"
#include "common/messages.h"
#include "common/wire_codec.h"

namespace {

using namespace adaps;  // NOLINT: a tool of one file

std::string g_dir;

void Write(const std::string& name, const OutMessage& m, uint8_t flags = 0) {
  std::vector<uint8_t> bytes = {flags, static_cast<uint8_t>(m.header.size() & 0xff),
                                static_cast<uint8_t>(m.header.size() >> 8)};
  bytes.insert(bytes.end(), m.header.data(), m.header.data() + m.header.size());
  if (m.payload) bytes.insert(bytes.end(), m.payload->begin(), m.payload->end());
  std::ofstream(g_dir + "/" + name, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

SharedBytes Encoded(CompressorKind kind, size_t n, IndexCoding coding) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i * 37) % 23) - 11.0f;
  CompressorOptions o;
  o.kind = kind;
  o.bin_size = 8;
  o.topk_fraction = 0.1;
  auto c = MakeCompressor(o);
  SliceState s(n);
  CompressedUpdate u;
  auto bytes = std::make_shared<Bytes>();
  if (!c.ok() || !(*c)->Compress(g, s, u).ok() || !EncodeUpdate(u, coding, bytes.get()).ok()) {
    std::abort();
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  const Sender worker{msg::Role::Worker, 0};
  const Sender sched{msg::Role::Scheduler, 0};
  uint64_t id = 1;
  {
    flatbuffers::FlatBufferBuilder b;
    auto x = msg::CreateRegister(b, msg::Role::Worker, b.CreateString("tcp://127.0.0.1:1"),
                                 b.CreateString("w0"));
    Write("register", FinishEnvelope(b, worker, x, id++, 0));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    std::vector<flatbuffers::Offset<msg::NodeInfo>> nodes = {
        msg::CreateNodeInfo(b, msg::Role::Server, 0, b.CreateString("inproc://s"),
                            b.CreateString("s0"), true),
        msg::CreateNodeInfo(b, msg::Role::Worker, 0, b.CreateString(""), b.CreateString(""),
                            false)};
    auto x = msg::CreateClusterView(b, 0, 1, 1, 7, b.CreateVector(nodes), 100);
    Write("cluster_view", FinishEnvelope(b, sched, x, 0, 0));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    Write("heartbeat", FinishEnvelope(b, worker, msg::CreateHeartbeat(b, 3), id++, 0));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    Write("heartbeat_ack", FinishEnvelope(b, sched, msg::CreateHeartbeatAck(b, 3), 0, 9));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    Write("barrier", FinishEnvelope(b, worker, msg::CreateBarrier(b, 2), id++, 0));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    auto x = msg::CreateDeclareTensor(b, b.CreateString("t"), 64, 8);
    Write("declare_tensor", FinishEnvelope(b, worker, x, id++, 0));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    std::vector<msg::Slice> slices = {msg::Slice(0, 32, 0), msg::Slice(32, 32, 0)};
    auto x = msg::CreateTensorLayout(b, 0, b.CreateString("t"), 64, 8,
                                     b.CreateVectorOfStructs(slices));
    Write("tensor_layout", FinishEnvelope(b, sched, x, 0, 4));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    auto x = msg::CreateDeclareSlice(b, 0, b.CreateString("t"), 64, 8, true);
    std::vector<float> init(64, 0.5f);
    Write("declare_slice_existing", FinishEnvelope(b, worker, x, id++, 0, FloatsToBytes(init)));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    auto x = msg::CreateDeclareSlice(b, 1, b.CreateString("u"), 16, 4, false);
    Write("declare_slice_new", FinishEnvelope(b, worker, x, id++, 0));
  }
  const std::pair<CompressorKind, msg::PayloadKind> kinds[] = {
      {CompressorKind::kDense, msg::PayloadKind::Dense},
      {CompressorKind::kAdaComp, msg::PayloadKind::AdaComp},
      {CompressorKind::kTopK, msg::PayloadKind::TopK},
      {CompressorKind::kSign, msg::PayloadKind::Sign}};
  for (const auto& [kind, pk] : kinds) {
    for (auto coding : {IndexCoding::kRice, IndexCoding::kPlain32}) {
      flatbuffers::FlatBufferBuilder b;
      auto x = msg::CreatePush(b, 0, 0, pk);
      Write(std::string("push_") + CompressorKindName(kind) +
                (coding == IndexCoding::kRice ? "_rice" : "_plain32"),
            FinishEnvelope(b, worker, x, id++, 0, Encoded(kind, 64, coding)));
    }
  }
  {
    flatbuffers::FlatBufferBuilder b;
    auto x = msg::CreatePush(b, 0, 0, msg::PayloadKind::Dense);
    Write("push_wrong_length",
          FinishEnvelope(b, worker, x, id++, 0, Encoded(CompressorKind::kDense, 63, IndexCoding::kRice)));
  }
  for (auto format : {msg::PullFormat::Dense, msg::PullFormat::Recompressed}) {
    flatbuffers::FlatBufferBuilder b;
    auto x = msg::CreatePullRequest(b, 0, 0, 0, format);
    Write(format == msg::PullFormat::Dense ? "pull_dense" : "pull_recompressed",
          FinishEnvelope(b, worker, x, id++, 0));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    Write("resume", FinishEnvelope(b, worker, msg::CreateResume(b, 0, 3), id++, 0));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    auto x = msg::CreatePullResponse(b, 0, 1, 0, msg::PullFormat::Dense);
    std::vector<float> v(64, 1.0f);
    Write("pull_response", FinishEnvelope(b, sched, x, 0, 5, FloatsToBytes(v)));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    std::vector<flatbuffers::Offset<msg::HyperParam>> ps = {
        msg::CreateHyperParam(b, b.CreateString("learning_rate"), 0.1),
        msg::CreateHyperParam(b, b.CreateString("momentum"), 0.5)};
    Write("set_hyper", FinishEnvelope(b, worker, msg::CreateSetHyper(b, b.CreateVector(ps)), id++, 0));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    auto x = msg::CreateCheckpoint(b, b.CreateString("/tmp/adaps-fuzz-should-not-exist"));
    Write("checkpoint", FinishEnvelope(b, worker, x, id++, 0));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    Write("leave", FinishEnvelope(b, worker, msg::CreateLeave(b), id++, 0));
  }
  {
    flatbuffers::FlatBufferBuilder b;
    auto x = msg::CreateShutdown(b, b.CreateString("forged"));
    Write("shutdown", FinishEnvelope(b, sched, x, 0, 0));
  }
  Write("ack", MakeAck(sched, 3));
  Write("error", MakeError(sched, 3, absl::DataLossError("seed")));
  Write("three_frames", MakeAck(worker, 0), 2);
  {
    // A fusion bucket (slice 2, capacity 100) with two members, rank 0's values of the last.
    flatbuffers::FlatBufferBuilder b;
    std::vector<msg::Segment> segs = {msg::Segment(40, 8), msg::Segment(24, 8)};
    auto x = msg::CreateDeclareSlice(b, 2, b.CreateString("adaps.fusion/0"), 100, 1, true,
                                     b.CreateString(""), b.CreateVectorOfStructs(segs));
    std::vector<float> init(24, 0.25f);
    Write("declare_slice_bucket", FinishEnvelope(b, worker, x, id++, 0, FloatsToBytes(init)));
  }
  {
    // Its push: a segmented container of an AdaComp and a dense member.
    SharedBytes a = Encoded(CompressorKind::kAdaComp, 40, IndexCoding::kRice);
    SharedBytes d = Encoded(CompressorKind::kDense, 24, IndexCoding::kRice);
    const std::vector<WireSegment> table = {{40, 8}, {24, 8}};
    const std::vector<absl::Span<const uint8_t>> parts = {*a, *d};
    auto bytes = std::make_shared<Bytes>();
    if (!EncodeSegmented(table, parts, bytes.get()).ok()) return 1;
    flatbuffers::FlatBufferBuilder b;
    auto x = msg::CreatePush(b, 2, 0, msg::PayloadKind::Segmented);
    Write("push_segmented", FinishEnvelope(b, worker, x, id++, 0, bytes));
  }
  return 0;
}
