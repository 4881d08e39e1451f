// The C API over an in-process scheduler and server on loopback.
#include "adaps/adaps_c.h"

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/server.h"

namespace adaps {
namespace {

TEST(CApi, DeclaresPushesPullsAndReportsErrors) {
  SchedulerConfig sc;
  sc.log_level = "warn";
  Scheduler scheduler(sc);
  ASSERT_TRUE(scheduler.Start().ok());
  ServerConfig vc;
  vc.scheduler = scheduler.endpoint();
  vc.optimizer.kind = OptimizerKind::kSgd;
  vc.optimizer.learning_rate = 1.0f;
  vc.log_level = "warn";
  Server server(vc);
  absl::Status server_status;
  std::thread start([&] { server_status = server.Start(); });

  char error[256] = {0};
  adaps_worker* w = adaps_worker_create(scheduler.endpoint().c_str(), 5000, error, sizeof(error));
  start.join();
  ASSERT_NE(w, nullptr) << error;
  ASSERT_TRUE(server_status.ok());
  EXPECT_EQ(adaps_worker_rank(w), 0);
  EXPECT_EQ(adaps_worker_num_workers(w), 1);
  EXPECT_STREQ(adaps_worker_server_optimizer(w), "sgd");  // what a pull answers: parameters

  const int64_t shape[] = {2, 3};
  adaps_tensor_spec spec{"w", shape, 2, 50, /*dense*/ 0, 0.01, /*dense pull*/ 0};
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  ASSERT_EQ(adaps_worker_declare(w, &spec, values.data(), values.size()), 0)
      << adaps_worker_last_error(w);
  ASSERT_EQ(adaps_worker_set_hyper(w, "learning_rate", 0.5), 0);
  std::vector<float> grad = {2, 2, 2, 2, 2, 2}, out(6);
  ASSERT_EQ(adaps_worker_push_pull(w, "w", grad.data(), out.data(), 6), 0)
      << adaps_worker_last_error(w);
  EXPECT_EQ(out, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  uint64_t wire = 0, dense = 0;
  ASSERT_EQ(adaps_worker_traffic(w, "w", &wire, &dense), 0);
  EXPECT_EQ(dense, 2u * 6 * 4);
  EXPECT_GT(wire, dense);
  std::vector<float> exact(6, -1.0f);
  ASSERT_EQ(adaps_worker_pull_parameters(w, "w", exact.data(), 6), 0)
      << adaps_worker_last_error(w);
  EXPECT_EQ(exact, out);
  EXPECT_EQ(adaps_worker_pull_parameters(w, "w", exact.data(), 5), 3);
  EXPECT_EQ(adaps_worker_pull_parameters(w, "missing", exact.data(), 6), 3);
  EXPECT_EQ(adaps_worker_pull_parameters(w, nullptr, exact.data(), 6), 3);

  EXPECT_EQ(adaps_worker_push_pull(w, "missing", grad.data(), out.data(), 6), 3);
  EXPECT_NE(std::string(adaps_worker_last_error(w)).find("not declared"), std::string::npos);
  EXPECT_EQ(adaps_worker_set_hyper(w, "bogus", 1.0), 3);
  EXPECT_EQ(adaps_worker_set_bin_size(w, "w", 10), 3);  // a dense tensor has no bin size
  EXPECT_NE(std::string(adaps_worker_last_error(w)).find("AdaComp"), std::string::npos);
  EXPECT_EQ(adaps_worker_set_bin_size(w, nullptr, 10), 3);
  // The message a thread was given stays as it was while another thread records a new error
  // (it is a copy, not a pointer into the handle's guarded state).
  EXPECT_EQ(adaps_worker_push_pull(w, "a-long-tensor-name-that-nobody-declared-at-all",
                                   grad.data(), out.data(), 6),
            3);
  // A tensor on a device: the host call refuses it; without a GPU (or without CUDA in the
  // build) the declaration says which, and a host tensor refuses the device call.
  adaps_tensor_spec on_device{"g", shape, 2, 50, /*adacomp*/ 1, 0.01, /*dense pull*/ 0};
  const int declared = adaps_worker_declare_on_device(w, &on_device, 0, values.data(), 6);
  if (declared != 0) {
    EXPECT_TRUE(declared == 12 || declared == 14) << declared;
    const std::string why = adaps_worker_last_error(w);
    EXPECT_TRUE(why.find("without CUDA") != std::string::npos ||
                why.find("CUDA device") != std::string::npos ||
                why.find("GPU") != std::string::npos) << why;
  } else {
    EXPECT_EQ(adaps_worker_push_pull(w, "g", grad.data(), out.data(), 6), 3);
  }
  EXPECT_EQ(adaps_worker_declare_on_device(w, &on_device, -1, values.data(), 6), 3);
  EXPECT_EQ(adaps_worker_push_pull_device(w, "w", grad.data(), out.data(), 6, nullptr), 3);
  EXPECT_NE(std::string(adaps_worker_last_error(w)).find("host memory"), std::string::npos);
  EXPECT_EQ(adaps_worker_push_pull_device(w, "w", grad.data(), out.data(), 5, nullptr), 3);
  EXPECT_EQ(adaps_worker_push_pull(w, "a-long-tensor-name-that-nobody-declared-at-all",
                                   grad.data(), out.data(), 6),
            3);
  const char* seen = adaps_worker_last_error(w);
  const std::string before = seen;
  std::thread([&] { EXPECT_EQ(adaps_worker_declare(w, nullptr, nullptr, 0), 3); }).join();
  EXPECT_EQ(std::string(seen), before);
  EXPECT_NE(std::string(adaps_worker_last_error(w)).find("null tensor spec"), std::string::npos);
  adaps_worker_destroy(w);
  EXPECT_TRUE(scheduler.WaitForShutdown(absl::Seconds(5)));
  EXPECT_TRUE(server.WaitForShutdown(absl::Seconds(5)));
}

TEST(CApi, UnreachableSchedulerGivesNullAndAReason) {
  char error[256] = {0};
  // Port 1 on loopback: nothing listens; the register deadline is the request timeout.
  adaps_worker* w = adaps_worker_create("tcp://127.0.0.1:1", 300, error, sizeof(error));
  EXPECT_EQ(w, nullptr);
  EXPECT_NE(std::string(error).find("UNAVAILABLE"), std::string::npos) << error;
}

}  // namespace
}  // namespace adaps
