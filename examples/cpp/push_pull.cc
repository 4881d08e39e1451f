// A minimal external trainer over the installed adaps worker library: connects to a
// scheduler, declares one tensor, runs a few PushPull steps of a toy least-squares problem
// and prints the parameters. Usage: adaps-example-push-pull <scheduler address> [steps]
//
// Every worker of the cluster runs this; the servers apply SGD (the default optimizer).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "adaps/worker.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s tcp://host:port [steps]\n", argv[0]);
    return 2;
  }
  const int steps = argc > 2 ? std::atoi(argv[2]) : 5;

  adaps::WorkerOptions options;
  options.scheduler = argv[1];
  options.register_timeout = absl::Seconds(20);
  options.request_timeout = absl::Seconds(10);
  options.log_level = "warn";
  absl::StatusOr<std::unique_ptr<adaps::Worker>> created = adaps::Worker::Create(options);
  if (!created.ok()) {
    std::fprintf(stderr, "connect: %s\n", created.status().ToString().c_str());
    return 1;
  }
  adaps::Worker& worker = **created;

  // Parameters w (2x4, zeros), target t: the gradient of 0.5*|w - t|^2 is w - t.
  adaps::TensorSpec spec;
  spec.name = "w";
  spec.shape = {2, 4};
  spec.bin_size = 4;
  spec.compression = adaps::Compression::kDense;
  std::vector<float> w(8, 0.0f), target(8), grad(8);
  for (int i = 0; i < 8; ++i) target[i] = static_cast<float>(i + 1);
  if (absl::Status s = worker.Declare(spec, absl::MakeSpan(w)); !s.ok()) {
    std::fprintf(stderr, "declare: %s\n", s.ToString().c_str());
    return 1;
  }
  if (absl::Status s = worker.SetHyper({{"learning_rate", 0.5}}); !s.ok()) {
    std::fprintf(stderr, "set_hyper: %s\n", s.ToString().c_str());
    return 1;
  }
  for (int step = 0; step < steps; ++step) {
    for (int i = 0; i < 8; ++i) grad[i] = w[i] - target[i];
    absl::Status s = worker.PushPull("w", grad, absl::MakeSpan(w)).get();
    if (!s.ok()) {
      std::fprintf(stderr, "push_pull: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::printf("rank %d of %d after %d steps: w =", worker.rank(), worker.num_workers(), steps);
  for (float x : w) std::printf(" %.4f", x);
  std::printf("\n");
  absl::StatusOr<adaps::TrafficCounters> traffic = worker.Traffic("w");
  if (traffic.ok()) {
    std::printf("pushes %llu, wire bytes %llu (dense %llu)\n",
                static_cast<unsigned long long>(traffic->pushes),
                static_cast<unsigned long long>(traffic->push_wire_bytes),
                static_cast<unsigned long long>(traffic->push_dense_bytes));
  }
  if (absl::Status s = worker.Stop(); !s.ok()) {
    std::fprintf(stderr, "stop: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
