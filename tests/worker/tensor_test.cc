// A Run's outcome and the writers of its `out` (worker/tensor.h): a failure decided while a
// pull answer is still being written into `out` sets the future only once that write ended,
// so a caller that sees the future ready may free `out`.
#include "worker/tensor.h"

#include <chrono>
#include <future>
#include <vector>

#include "common/wire_codec.h"
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
  ASSERT_TRUE(op_->BeginWrite());
  op_->Settle(absl::DataLossError("the other slice"));
  EXPECT_FALSE(IsReady(future_));
  EXPECT_FALSE(op_->BeginWrite());  // no new write starts once decided
  op_->EndWrite();
  ASSERT_TRUE(IsReady(future_));
  EXPECT_EQ(future_.get().code(), absl::StatusCode::kDataLoss);
}

TEST_F(RunOutcome, WithNoWriterTheOutcomeIsSetAtOnceAndTheFirstOneWins) {
  absl::MutexLock lock(&op_->mu);
  op_->Settle(absl::UnavailableError("first"));
  op_->Settle(absl::OkStatus());
  ASSERT_TRUE(IsReady(future_));
  EXPECT_EQ(future_.get().code(), absl::StatusCode::kUnavailable);
}

TEST_F(RunOutcome, TheStagesGoInOrderAndEndOnlyWithTheOutcome) {
  absl::MutexLock lock(&op_->mu);
  EXPECT_EQ(op_->stage(), RunStage::kQueued);
  op_->Advance(RunStage::kPrepared);
  op_->Advance(RunStage::kSent);
  op_->Advance(RunStage::kSent);  // one slice sent again early
  op_->Advance(RunStage::kRetrying);
  op_->Advance(RunStage::kSent);
  EXPECT_EQ(op_->stage(), RunStage::kSent);
  ASSERT_TRUE(op_->BeginWrite());
  op_->Settle(absl::OkStatus());
  EXPECT_EQ(op_->stage(), RunStage::kDecided);
  op_->Advance(RunStage::kRetrying);  // a retry that lost the race: stays decided
  EXPECT_EQ(op_->stage(), RunStage::kDecided);
  EXPECT_FALSE(IsReady(future_));
  op_->EndWrite();
  EXPECT_EQ(op_->stage(), RunStage::kSettled);
  EXPECT_TRUE(IsReady(future_));
  EXPECT_STREQ(RunStageName(op_->stage()), "settled");
}

#if !defined(NDEBUG) || defined(ADAPS_DCHECKS)
TEST_F(RunOutcome, AStageOutOfOrderIsABug) {
  EXPECT_DEATH(
      {
        absl::MutexLock lock(&op_->mu);
        op_->Advance(RunStage::kSent);  // never prepared
      },
      "out of order: queued to sent");
  EXPECT_DEATH(
      {
        absl::MutexLock lock(&op_->mu);
        op_->Advance(RunStage::kPrepared);
        op_->Advance(RunStage::kRetrying);  // never sent
      },
      "out of order: prepared to retrying");
}
#endif

TEST_F(RunOutcome, TheLastOfTwoWritersSetsTheDeferredOutcome) {
  absl::MutexLock lock(&op_->mu);
  ASSERT_TRUE(op_->BeginWrite());
  ASSERT_TRUE(op_->BeginWrite());
  op_->Settle(absl::OkStatus());
  op_->EndWrite();
  EXPECT_FALSE(IsReady(future_));
  op_->EndWrite();
  EXPECT_TRUE(IsReady(future_));
}

// A dense tensor of two slices, as Declare would leave it (no residues).
std::unique_ptr<Tensor> DenseTensor(uint32_t slice_length) {
  auto t = std::make_unique<Tensor>();
  t->length = 2 * slice_length;
  t->meta.resize(2);
  t->meta[0].info.offset = 0;
  t->meta[0].info.length = slice_length;
  t->meta[1].info.offset = slice_length;
  t->meta[1].info.length = slice_length;
  absl::MutexLock lock(&t->mu);
  t->slices.resize(2);
  return t;
}

// The next push of a slice writes its last push's buffer again once nobody else holds it
// (no allocation per step), and a new one while it is still held (the transport not done
// with it, or a Run keeping it to send again after a server restart).
TEST(EncodePush, ReusesASlicesBufferOnlyOnceItWasReleased) {
  auto t = DenseTensor(1000);
  std::vector<float> g(2000, 1.0f);
  absl::MutexLock lock(&t->mu);
  auto first = EncodePush(*t, g, IndexCoding::kRice);
  ASSERT_TRUE(first.ok()) << first.status();
  auto held = EncodePush(*t, g, IndexCoding::kRice);  // `first` still held
  ASSERT_TRUE(held.ok());
  EXPECT_NE((*held)[0].get(), (*first)[0].get());
  EXPECT_EQ(*(*held)[0], *(*first)[0]);
  // The buffer object, not its data pointer: a new buffer may get freed memory back.
  const Bytes* held_bytes = (*held)[0].get();
  first->clear();
  held->clear();  // released: the next push writes the same bytes again
  g[5] = 2.0f;
  auto again = EncodePush(*t, g, IndexCoding::kRice);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].get(), held_bytes);
  std::vector<float> decoded(1000, 0.0f);
  ASSERT_TRUE(DecodeAdd(*(*again)[0], 1.0f, absl::MakeSpan(decoded)).ok());
  EXPECT_EQ(decoded[5], 2.0f);
  EXPECT_EQ(decoded[6], 1.0f);
}

}  // namespace
}  // namespace adaps
