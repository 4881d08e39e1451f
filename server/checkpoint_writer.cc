#include "server/checkpoint_writer.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "server/checkpoint.h"

namespace adaps {

void CheckpointWriter::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void CheckpointWriter::Stop() {
  writes_.Close();
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::SetStepCheckpoints(
    std::function<std::string(uint64_t)> path, std::string job_id,
    std::function<void(uint64_t, absl::Status, size_t)> done) {
  std::lock_guard<std::mutex> lock(mu_);
  step_path_ = std::move(path);
  step_job_id_ = std::move(job_id);
  step_done_ = std::move(done);
}

void CheckpointWriter::SetHyper(HyperValues hyper) {
  std::lock_guard<std::mutex> lock(mu_);
  hyper_ = std::move(hyper);
}

HyperValues CheckpointWriter::hyper() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hyper_;
}

void CheckpointWriter::AddStepRecord(uint64_t step, SliceRecord record) {
  auto job = std::make_shared<CheckpointJob>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!step_path_) return;
    std::vector<SliceRecord>& records = step_records_[step];
    records.push_back(std::move(record));
    if (records.size() + unheld_.size() < slices_.load()) return;
    job->records = std::move(records);
    // Older steps some slice never reached (e.g. it moved on past them) are given up.
    step_records_.erase(step_records_.begin(), step_records_.upper_bound(step));
    job->path = step_path_(step);
    job->job_id = step_job_id_;
    job->hyper = hyper_;
    job->done = [done = step_done_, step](absl::Status st, size_t n) {
      done(step, std::move(st), n);
    };
  }
  Write(std::move(job));
}

void CheckpointWriter::SetShardHeld(uint64_t key, bool held) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held) {
    unheld_.erase(key);
  } else {
    unheld_.insert(key);
  }
}

void CheckpointWriter::Write(std::shared_ptr<CheckpointJob> job) {
  if (!writes_.Push(job)) job->done(absl::UnavailableError("the server is stopping"), 0);
}

void CheckpointWriter::Run() {
  std::deque<std::shared_ptr<CheckpointJob>> batch;
  while (writes_.PopAll(batch)) {
    for (auto& job : batch) {
      std::vector<SliceRecord> records;
      {
        std::lock_guard<std::mutex> lock(job->mu);
        records = std::move(job->records);
      }
      // Key order, as one thread wrote them: the same state gives the same file.
      std::sort(records.begin(), records.end(),
                [](const SliceRecord& a, const SliceRecord& b) { return a.key < b.key; });
      absl::Status status = WriteCheckpointFile(job->path, records, job->job_id, job->hyper);
      job->done(std::move(status), records.size());
    }
    batch.clear();
  }
}

}  // namespace adaps
