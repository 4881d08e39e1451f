// A Run's outcome and the writers of its `out` (worker/tensor.h): a failure decided while a
// pull answer is still being written into `out` sets the future only once that write ended,
// so a caller that sees the future ready may free `out`.
#include "worker/tensor.h"

#include <chrono>
#include <future>
#include <vector>

#include "gtest/gtest.h"

namespace adaps {
namespace {

bool IsReady(std::future<absl::Status>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

class RunOutcome : public ::testing::Test {
 protected:
  RunOutcome() {
    t_.meta.resize(2);
    op_ = std::make_unique<RunOp>(&t_, false, true, absl::MakeSpan(out_));
    future_ = op_->promise.get_future();
  }
  Tensor t_;
  std::vector<float> out_ = std::vector<float>(4);
  std::unique_ptr<RunOp> op_;
  std::future<absl::Status> future_;
};

TEST_F(RunOutcome, AFailureDuringAWriteIsReportedWhenTheWriteEnds) {
  absl::MutexLock lock(&op_->mu);
  ASSERT_TRUE(BeginWrite(*op_));
  Settle(*op_, absl::DataLossError("the other slice"));
  EXPECT_FALSE(IsReady(future_));
  EXPECT_FALSE(BeginWrite(*op_));  // no new write starts once decided
  EndWrite(*op_);
  ASSERT_TRUE(IsReady(future_));
  EXPECT_EQ(future_.get().code(), absl::StatusCode::kDataLoss);
}

TEST_F(RunOutcome, WithNoWriterTheOutcomeIsSetAtOnceAndTheFirstOneWins) {
  absl::MutexLock lock(&op_->mu);
  Settle(*op_, absl::UnavailableError("first"));
  Settle(*op_, absl::OkStatus());
  ASSERT_TRUE(IsReady(future_));
  EXPECT_EQ(future_.get().code(), absl::StatusCode::kUnavailable);
}

TEST_F(RunOutcome, TheLastOfTwoWritersSetsTheDeferredOutcome) {
  absl::MutexLock lock(&op_->mu);
  ASSERT_TRUE(BeginWrite(*op_));
  ASSERT_TRUE(BeginWrite(*op_));
  Settle(*op_, absl::OkStatus());
  EndWrite(*op_);
  EXPECT_FALSE(IsReady(future_));
  EndWrite(*op_);
  EXPECT_TRUE(IsReady(future_));
}

}  // namespace
}  // namespace adaps
