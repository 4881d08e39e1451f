// Fuzz target for every decoder of network input on the message side: the Envelope
// verifier (every body type of schemas/adaps.fbs) and the server's message handler.
//
// Input layout: u8 flags | u16 LE header length | header bytes | payload bytes.
//   flags bit 0: send a payload frame even when empty; bit 1: append a third frame.
// Each input is
//  1. run through VerifyEnvelope; when it verifies, every field of its body is read (a field
//     the verifier let through but that reads out of bounds is an ASan report);
//  2. sent as raw ZeroMQ frames to a real in-process Server (inproc://, one scheduler, one
//     server, one worker declaring slice 0, created once), followed by a probe pull. The
//     server must answer the probe (it is still alive), and unless the input was answered
//     with an Ack (a well-formed request the server accepted) the parameters the probe
//     returns must be exactly those before the input: a rejected input changes nothing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "adaps/worker.h"
#include "common/messages.h"
#include "common/transport.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace {

using adaps::msg::Body;

volatile size_t g_sink = 0;

void Touch(const flatbuffers::String* s) {
  if (s != nullptr) {
    for (char c : s->string_view()) g_sink += static_cast<unsigned char>(c);
  }
}

// Reads every field of a verified envelope's body.
void Walk(const adaps::msg::Envelope* env) {
  g_sink += env->version() + static_cast<size_t>(env->sender_role()) + env->request_id() +
            env->reply_to() + env->payload_size() + static_cast<size_t>(env->sender_rank());
  switch (env->body_type()) {
    case Body::Register: {
      auto* b = env->body_as_Register();
      Touch(b->address());
      Touch(b->identity());
      g_sink += static_cast<size_t>(b->role());
      break;
    }
    case Body::ClusterView: {
      auto* b = env->body_as_ClusterView();
      g_sink += b->your_rank() + b->num_servers() + b->num_workers() + b->epoch() +
                b->heartbeat_interval_ms();
      if (b->nodes()) {
        for (const auto* n : *b->nodes()) {
          if (n == nullptr) continue;
          Touch(n->address());
          Touch(n->identity());
          g_sink += n->rank() + n->alive() + static_cast<size_t>(n->role());
        }
      }
      break;
    }
    case Body::Heartbeat:
      g_sink += env->body_as_Heartbeat()->epoch();
      break;
    case Body::HeartbeatAck:
      g_sink += env->body_as_HeartbeatAck()->epoch();
      break;
    case Body::Barrier:
      g_sink += env->body_as_Barrier()->seq();
      break;
    case Body::DeclareTensor: {
      auto* b = env->body_as_DeclareTensor();
      Touch(b->name());
      g_sink += b->length() + b->bin_size();
      break;
    }
    case Body::TensorLayout: {
      auto* b = env->body_as_TensorLayout();
      Touch(b->name());
      g_sink += b->tensor_id() + b->length() + b->bin_size();
      if (b->slices()) {
        for (const auto* s : *b->slices()) g_sink += s->offset() + s->length() + s->server();
      }
      break;
    }
    case Body::DeclareSlice: {
      auto* b = env->body_as_DeclareSlice();
      Touch(b->name());
      g_sink += b->key() + b->length() + b->bin_size() + b->has_init();
      break;
    }
    case Body::Push: {
      auto* b = env->body_as_Push();
      g_sink += b->key() + b->step() + static_cast<size_t>(b->kind());
      break;
    }
    case Body::PullRequest: {
      auto* b = env->body_as_PullRequest();
      g_sink += b->key() + b->min_version() + b->have_version() + static_cast<size_t>(b->format());
      break;
    }
    case Body::Resume: {
      auto* b = env->body_as_Resume();
      g_sink += b->key() + b->seen_version();
      break;
    }
    case Body::PullResponse: {
      auto* b = env->body_as_PullResponse();
      g_sink += b->key() + b->version() + b->base_version() + static_cast<size_t>(b->format());
      break;
    }
    case Body::SetHyper: {
      auto* b = env->body_as_SetHyper();
      if (b->params()) {
        for (const auto* p : *b->params()) {
          if (p == nullptr) continue;
          Touch(p->name());
          g_sink += static_cast<size_t>(p->value() == 0.0);
        }
      }
      break;
    }
    case Body::Checkpoint:
      Touch(env->body_as_Checkpoint()->directory());
      break;
    case Body::Shutdown:
      Touch(env->body_as_Shutdown()->reason());
      break;
    case Body::Error: {
      auto* b = env->body_as_Error();
      Touch(b->message());
      g_sink += adaps::StatusFromError(b).raw_code();
      break;
    }
    case Body::Leave:
    case Body::Ack:
    case Body::NONE:
      break;
  }
}

constexpr size_t kLen = 64;
constexpr uint64_t kKey = 0;
// The probes' request ids start here; inputs with an id at or above it are skipped.
constexpr uint64_t kProbeIdBase = 0xFFFF00000000ull;

// The in-process cluster every input is sent to.
struct Target {
  Target() {
    context = std::make_shared<adaps::TransportContext>(1);
    adaps::SchedulerConfig sc;
    sc.bind = "inproc://fuzz-scheduler";
    sc.heartbeat_interval = absl::Milliseconds(200);
    sc.dead_timeout = absl::Seconds(3600);
    sc.log_level = "off";
    scheduler = std::make_unique<adaps::Scheduler>(sc, context);
    if (!scheduler->Start().ok()) std::abort();
    adaps::ServerConfig vc;
    vc.scheduler = "inproc://fuzz-scheduler";
    vc.bind = "inproc://fuzz-server";
    vc.optimizer.kind = adaps::OptimizerKind::kSumOnly;
    vc.max_slice_elements = 1 << 16;  // what a fuzzer may make the server allocate
    vc.log_level = "off";
    server = std::make_unique<adaps::Server>(vc, context);
    absl::Status server_status;
    std::thread start([&] { server_status = server->Start(); });
    adaps::WorkerOptions wo;
    wo.scheduler = "inproc://fuzz-scheduler";
    wo.context = context;
    wo.log_level = "off";
    auto w = adaps::Worker::Create(wo);
    start.join();
    if (!server_status.ok() || !w.ok()) std::abort();
    worker = *std::move(w);
    std::vector<float> init(kLen);
    for (size_t i = 0; i < kLen; ++i) init[i] = static_cast<float>(i);
    if (!worker->Declare({"t", {kLen}, 8, adaps::Compression::kDense}, absl::MakeSpan(init)).ok()) {
      std::abort();
    }
    raw = std::make_unique<zmq::socket_t>(context->get(), zmq::socket_type::dealer);
    raw->set(zmq::sockopt::linger, 0);
    raw->set(zmq::sockopt::rcvtimeo, 5000);
    raw->connect("inproc://fuzz-server");
    baseline = Probe();
    if (!baseline) std::abort();
  }

  // A dense pull of slice 0 with a fresh request id (a fixed one can be copied into an input
  // by the fuzzer -- it did, inside a header the server answers with a version error);
  // returns the parameters, or nothing
  // when the server did not answer. Replies to the input (Acks, Errors) come first; `acked`
  // says whether one of them was an Ack.
  std::optional<std::vector<float>> Probe(bool* acked = nullptr) {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = adaps::msg::CreatePullRequest(fbb, kKey, 0, 0, adaps::msg::PullFormat::Dense);
    auto m = adaps::FinishEnvelope(fbb, adaps::Sender{adaps::msg::Role::Worker, 0}, body,
                                   ++probe_id, 0);
    if (!raw->send(zmq::buffer(m.header.data(), m.header.size()))) return std::nullopt;
    while (true) {
      std::vector<zmq::message_t> frames;
      auto got = zmq::recv_multipart(*raw, std::back_inserter(frames));
      if (!got || frames.empty()) return std::nullopt;
      auto env = adaps::VerifyEnvelope(
          absl::MakeConstSpan(static_cast<const uint8_t*>(frames[0].data()), frames[0].size()));
      if (!env.ok()) std::abort();  // the server sent something invalid
      if ((*env)->reply_to() == probe_id) {
        if (frames.size() != 2 || frames[1].size() != kLen * sizeof(float)) std::abort();
        std::vector<float> out(kLen);
        std::memcpy(out.data(), frames[1].data(), frames[1].size());
        return out;
      }
      if (acked != nullptr && (*env)->body_type() == Body::Ack) *acked = true;
    }
  }

  uint64_t probe_id = kProbeIdBase;  // request ids of inputs are rarely this high
  std::shared_ptr<adaps::TransportContext> context;
  std::unique_ptr<adaps::Scheduler> scheduler;
  std::unique_ptr<adaps::Server> server;
  std::unique_ptr<adaps::Worker> worker;
  std::unique_ptr<zmq::socket_t> raw;
  std::optional<std::vector<float>> baseline;
};

// The request id of a header the FlatBuffers verifier accepts, whatever its protocol version
// or body; nothing for a header it rejects (the server drops those without a reply).
std::optional<uint64_t> RequestIdOf(absl::Span<const uint8_t> header) {
  if (header.empty()) return std::nullopt;
  flatbuffers::Verifier verifier(header.data(), header.size(), /*max_depth=*/32,
                                 /*max_tables=*/100000);
  if (!adaps::msg::VerifyEnvelopeBuffer(verifier)) return std::nullopt;
  return adaps::msg::GetEnvelope(header.data())->request_id();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t flags = data[0];
  size_t header_len = data[1] | (size_t{data[2]} << 8);
  data += 3;
  size -= 3;
  if (header_len > size) header_len = size;
  // FlatBuffers reads need the buffer aligned (the transport's frames are).
  std::vector<uint64_t> aligned((header_len + 7) / 8);
  if (header_len) std::memcpy(aligned.data(), data, header_len);
  const absl::Span<const uint8_t> header(reinterpret_cast<const uint8_t*>(aligned.data()),
                                         header_len);
  const absl::Span<const uint8_t> payload(data + header_len, size - header_len);

  // 1. The decode path of every message type.
  auto env = adaps::VerifyEnvelope(header);
  if (env.ok()) Walk(*env);

  // 2. The server's handler, through its real socket. The request id of the input must not
  // collide with the probe's.
  static Target* target = new Target();  // lives for the whole run
  // Not just the next probe's: the server's engine threads may answer an input after the
  // probe that follows it, so an input carrying a later probe's id (ids are predictable,
  // and the fuzzer learns them from the comparisons) would leave a stale reply that a later
  // probe takes for its own. Ids from the probes' range on are left to the probes.
  // The server answers an envelope of another protocol version too (with an Error carrying
  // its request id), so the id is read from any header that passes the FlatBuffers
  // verifier, whatever its version or body.
  if (const auto id = RequestIdOf(header); id && *id >= kProbeIdBase) return 0;
  zmq::message_t h(header.data(), header.size());
  const bool with_payload = !payload.empty() || (flags & 1);
  const bool third = (flags & 2) != 0;
  auto more = zmq::send_flags::sndmore;
  if (!target->raw->send(h, (with_payload || third) ? more : zmq::send_flags::none)) {
    std::abort();
  }
  if (with_payload) {
    zmq::message_t p(payload.data(), payload.size());
    (void)target->raw->send(p, third ? more : zmq::send_flags::none);
  }
  if (third) {
    zmq::message_t x("x", 1);
    (void)target->raw->send(x, zmq::send_flags::none);
  }
  bool acked = false;
  auto after = target->Probe(&acked);
  if (!after) std::abort();  // the server stopped answering
  if (!acked && *after != *target->baseline) std::abort();  // rejected input changed state
  target->baseline = after;
  return 0;
}
