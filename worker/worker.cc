// The public Worker: forwards to Worker::Impl (worker/worker_impl.h).
#include "adaps/worker.h"

#include "common/config.h"
#include "common/status_macros.h"
#include "worker/worker_impl.h"

namespace adaps {

absl::Status WorkerOptions::LoadCurveKeys(const std::string& server_key_file,
                                          const std::string& client_key_file) {
  // A CURVE client needs a key pair of its own, which the cluster must list: without one the
  // connection failed only after start-up, with "cannot connect ...: Invalid argument".
  if (!server_key_file.empty() && client_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a CURVE server key (--curve_server_key, curve_server_key=, ADAPS_CURVE_SERVER_KEY) "
        "needs this worker's key pair too (--curve_client_key, curve_client_key=, "
        "ADAPS_CURVE_CLIENT_KEY): made by adaps-keygen, its .pub listed in the cluster's "
        "--curve_allowed_clients");
  }
  ADAPS_ASSIGN_OR_RETURN(CurveKeys keys, adaps::LoadCurveKeys(server_key_file, client_key_file,
                                                               "", /*serving=*/false));
  curve_server_public_key = keys.server_public_key;
  curve_public_key = keys.client_public_key;
  curve_secret_key = keys.client_secret_key;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const WorkerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  ADAPS_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Worker>(new Worker(std::move(impl)));
}

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() = default;

int Worker::rank() const { return impl_->rank(); }
int Worker::num_workers() const { return impl_->num_workers(); }
int Worker::live_workers() const { return impl_->live_workers(); }
bool Worker::rejoined() const { return impl_->rejoined(); }
int Worker::num_servers() const { return impl_->num_servers(); }
std::string Worker::server_optimizer() const { return impl_->server_optimizer(); }

absl::Status Worker::Declare(const TensorSpec& spec, absl::Span<float> values) {
  return impl_->Declare(spec, values);
}

std::future<absl::Status> Worker::PushPull(absl::string_view name, absl::Span<const float> grad,
                                           absl::Span<float> out) {
  return impl_->Run(name, grad, out, true, true);
}

std::future<absl::Status> Worker::Push(absl::string_view name, absl::Span<const float> grad) {
  return impl_->Run(name, grad, {}, true, false);
}

std::future<absl::Status> Worker::Pull(absl::string_view name, absl::Span<float> out) {
  return impl_->Run(name, {}, out, false, true);
}

std::future<absl::Status> Worker::PushPullOnDevice(absl::string_view name, const float* grad,
                                                   float* out, void* stream) {
  return impl_->RunOnDevice(name, grad, out, true, true, stream);
}

std::future<absl::Status> Worker::PushOnDevice(absl::string_view name, const float* grad,
                                               void* stream) {
  return impl_->RunOnDevice(name, grad, nullptr, true, false, stream);
}

std::future<absl::Status> Worker::PullOnDevice(absl::string_view name, float* out,
                                               void* stream) {
  return impl_->RunOnDevice(name, nullptr, out, false, true, stream);
}

absl::Status Worker::PullParameters(absl::string_view name, absl::Span<float> out) {
  return impl_->PullParameters(name, out);
}

absl::StatusOr<std::vector<uint32_t>> Worker::LastSent(absl::string_view name) const {
  return impl_->LastSent(name);
}

absl::Status Worker::Residue(absl::string_view name, absl::Span<float> out) const {
  return impl_->Residue(name, out);
}

absl::Status Worker::SaveResidues(const std::string& path) const {
  return impl_->SaveResidues(path);
}

absl::Status Worker::LoadResidues(const std::string& path) { return impl_->LoadResidues(path); }

void Worker::CloseFusionBuckets() { impl_->CloseFusionBuckets(); }

absl::Status Worker::SetBinSize(absl::string_view name, uint32_t bin_size) {
  return impl_->SetBinSize(name, bin_size);
}

absl::Status Worker::Barrier() { return impl_->Barrier(); }
absl::Status Worker::SetHyper(const std::vector<std::pair<std::string, double>>& params) {
  return impl_->SetHyper(params);
}
absl::Status Worker::Checkpoint(const std::string& directory) {
  return impl_->Checkpoint(directory);
}
absl::StatusOr<TrafficCounters> Worker::Traffic(absl::string_view name) const {
  return impl_->Traffic(name);
}
absl::StatusOr<std::vector<SliceInfo>> Worker::Slices(absl::string_view name) const {
  return impl_->Slices(name);
}
std::vector<std::string> Worker::TensorNames() const { return impl_->TensorNames(); }
absl::Status Worker::SetResidue(absl::string_view name, absl::Span<const float> values) {
  return impl_->SetResidue(name, values);
}
std::string Worker::ResidueCheckpointPath(const std::string& directory) const {
  return impl_->ResidueCheckpointPath(directory);
}
absl::Status Worker::Leave() { return impl_->Leave(); }
absl::Status Worker::Stop() { return impl_->Stop(); }

}  // namespace adaps
