// Raw ZeroMQ tcp throughput on loopback: the yardstick for adaps' dense push-pull
// (docs/benchmarks.md, "Cluster on loopback"). A DEALER sends `--messages` messages of `--bytes` each to a
// ROUTER that answers every message with one of the same size (like a push followed by a
// pull), `--window` in flight; prints payload GB/s one way and both ways.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "zmq.hpp"

ABSL_FLAG(int64_t, bytes, 10'000'000, "Message size in bytes");
ABSL_FLAG(int, messages, 50, "Messages each way");
ABSL_FLAG(int, window, 10, "Messages in flight");
ABSL_FLAG(bool, echo, true, "Server answers each message with one of the same size");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_bytes));
  const int messages = absl::GetFlag(FLAGS_messages);
  const int window = absl::GetFlag(FLAGS_window);
  const bool echo = absl::GetFlag(FLAGS_echo);
  try {
    zmq::context_t ctx(1);
    zmq::socket_t router(ctx, zmq::socket_type::router);
    router.bind("tcp://127.0.0.1:0");
    const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
    std::thread server([&] {
      std::vector<uint8_t> reply(bytes, 7);
      for (int i = 0; i < messages; ++i) {
        zmq::message_t id, body;
        (void)router.recv(id);
        (void)router.recv(body);
        if (echo) {
          (void)router.send(id, zmq::send_flags::sndmore);
          zmq::message_t out(reply.data(), reply.size());
          (void)router.send(out, zmq::send_flags::none);
        }
      }
    });
    zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
    dealer.connect(endpoint);
    std::vector<uint8_t> payload(bytes, 3);
    const auto start = std::chrono::steady_clock::now();
    int sent = 0, received = 0;
    while (received < (echo ? messages : 0) || sent < messages) {
      while (sent < messages && sent - received < window) {
        zmq::message_t out(payload.data(), payload.size());
        (void)dealer.send(out, zmq::send_flags::none);
        ++sent;
        if (!echo) ++received;
      }
      if (echo && received < messages) {
        zmq::message_t in;
        (void)dealer.recv(in);
        ++received;
      }
    }
    server.join();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double one_way = double(bytes) * messages / s / 1e9;
    std::printf("RAW_ZMQ bytes=%zu messages=%d window=%d echo=%d seconds=%.3f "
                "one_way_GBps=%.3f total_GBps=%.3f\n",
                bytes, messages, window, echo ? 1 : 0, s, one_way,
                echo ? 2 * one_way : one_way);
  } catch (const zmq::error_t& e) {
    std::fprintf(stderr, "zmq_raw_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
