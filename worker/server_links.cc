#include "worker/server_links.h"

#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace adaps {

absl::Status ServerLinks::Connect(const msg::ClusterView& view, int num_servers) {
  std::vector<std::string> addresses(num_servers);
  std::vector<uint64_t> instances(num_servers, 0);
  std::vector<bool> restartable(num_servers, false);
  if (view.nodes()) {
    for (const auto* n : *view.nodes()) {
      if (n->role() == msg::Role::Server && n->rank() >= 0 && n->rank() < num_servers &&
          n->address()) {
        addresses[n->rank()] = n->address()->str();
        instances[n->rank()] = n->instance();
        restartable[n->rank()] = n->identity() && n->identity()->size() > 0;
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    incarnation_.assign(num_servers, 0);
    restartable_ = restartable;
    alive_.assign(num_servers, true);
  }
  for (int s = 0; s < num_servers; ++s) {
    ADAPS_RET_CHECK(!addresses[s].empty(), absl::StatusCode::kDataLoss,
                    absl::StrCat("cluster view without an address for server ", s));
    ADAPS_ASSIGN_OR_RETURN(int p, transport_->Connect(addresses[s]));
    absl::MutexLock lock(&mu_);
    peer_.push_back(p);
  }
  // The addresses belong to the I/O thread (ApplyView compares against them): hand them over.
  std::promise<void> handed;
  if (!transport_->Post([this, &addresses, &instances, &handed] {
        ADAPS_DCHECK_ON_IO_THREAD(transport_);
        address_ = addresses;
        instance_ = instances;
        dead_.assign(addresses.size(), false);
        handed.set_value();
      })) {
    return absl::FailedPreconditionError("transport stopped while registering");
  }
  handed.get_future().wait();
  return absl::OkStatus();
}

int ServerLinks::Peer(int server) const {
  absl::MutexLock lock(&mu_);
  return peer_[server];
}

int ServerLinks::Peer(int server, uint64_t* incarnation) const {
  absl::MutexLock lock(&mu_);
  *incarnation = incarnation_[server];
  return peer_[server];
}

std::vector<int> ServerLinks::Peers() const {
  absl::MutexLock lock(&mu_);
  return peer_;
}

std::vector<uint64_t> ServerLinks::Incarnations() const {
  absl::MutexLock lock(&mu_);
  return incarnation_;
}

bool ServerLinks::Restartable(int server) const {
  absl::MutexLock lock(&mu_);
  return restartable_[server];
}

void ServerLinks::ApplyView(const msg::ClusterView& view) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (view.nodes() == nullptr) return;
  for (const auto* n : *view.nodes()) {
    if (n->role() != msg::Role::Server || n->rank() < 0) continue;
    const int r = n->rank();
    // The registration answer arrives before the servers are connected: nothing to update.
    if (static_cast<size_t>(r) >= address_.size()) continue;
    if (!n->alive()) {
      if (!dead_[r]) log_->get()->warn("server {} declared dead", r);
      dead_[r] = true;
      {
        absl::MutexLock lock(&mu_);
        alive_[r] = false;
      }
      transport_->FailPeer(Peer(r),
                           absl::UnavailableError(absl::StrCat("server ", r, " declared dead")));
      continue;
    }
    const std::string address = n->address() ? n->address()->str() : "";
    // Back at the same address with no view saying it died (it and the scheduler were killed
    // together): another process, which the requests sent to the old one never reached.
    const uint64_t instance = n->instance();
    const bool other_instance = instance != 0 && instance_[r] != 0 && instance != instance_[r];
    if (instance != 0 && !address.empty()) instance_[r] = instance;
    if (address.empty() || (address == address_[r] && !dead_[r] && !other_instance)) continue;
    int peer = Peer(r);
    if (address != address_[r]) {
      auto moved = transport_->Connect(address);
      if (!moved.ok()) {
        log_->get()->error("server {} moved to {}: {}", r, address, moved.status().ToString());
        continue;
      }
      peer = *moved;
    }
    log_->get()->warn("server {} restarted at {}: reconnected", r, address);
    int old;
    std::function<void(int)> on_restart;
    {
      absl::MutexLock lock(&mu_);
      old = peer_[r];
      peer_[r] = peer;
      ++incarnation_[r];
      alive_[r] = true;
      restartable_[r] = n->identity() && n->identity()->size() > 0;
      on_restart = on_restart_;
    }
    address_[r] = address;
    dead_[r] = false;
    transport_->FailPeer(old, absl::UnavailableError(absl::StrCat("server ", r, " restarted")));
    if (on_restart) on_restart(r);
  }
}

bool ServerLinks::WaitForNewIncarnation(int server, uint64_t old, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return incarnation_[server] != old || alive_[server] || closed_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  // (Alive in the same incarnation: it answered kUnavailable while still registering, and
  // the caller asks it again.)
  return (incarnation_[server] != old || alive_[server]) && !closed_;
}

void ServerLinks::SetOnRestart(std::function<void(int server)> on_restart) {
  absl::MutexLock lock(&mu_);
  on_restart_ = std::move(on_restart);
}

void ServerLinks::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace adaps
