// The worker's directory of its links to the servers: for each server rank, the transport
// peer it is reached through, its incarnation (bumped when it restarts: moved, or back after
// being declared dead), whether it can come back with its rank (it has an identity) and
// whether it is alive. One object with its own lock, so that the tensor table, the runner
// and membership do not share a mutex for it.
//
// Threads: Peer, Incarnations, Restartable and WaitForNewIncarnation from any thread (they
// take only this object's lock, a leaf: callers may hold a Tensor's lock); Connect from the
// registering thread before the I/O thread sees any view; ApplyView and Close on the I/O
// thread (Close also from Stop). The servers' addresses and "declared dead" flags are the I/O
// thread's (asserted).
#ifndef ADAPS_WORKER_SERVER_LINKS_H_
#define ADAPS_WORKER_SERVER_LINKS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/messages.h"
#include "common/transport.h"

namespace adaps {

class ServerLinks {
 public:
  ServerLinks(Transport* transport, const RoleLog* log) : transport_(transport), log_(log) {}
  ServerLinks(const ServerLinks&) = delete;
  ServerLinks& operator=(const ServerLinks&) = delete;

  // Connects to the `num_servers` servers of the registration's view (every one must have an
  // address) and hands their addresses to the I/O thread. kDataLoss for a view without a
  // server's address; kFailedPrecondition when the transport stopped meanwhile.
  absl::Status Connect(const msg::ClusterView& view, int num_servers);

  // The transport peer of server `server` (and its incarnation, read together).
  int Peer(int server) const;
  int Peer(int server, uint64_t* incarnation) const;
  std::vector<int> Peers() const;
  std::vector<uint64_t> Incarnations() const;
  // The server has an identity: it can come back with its rank (worth waiting for).
  bool Restartable(int server) const;

  // I/O thread: a newer view. Fails the requests to servers declared dead; reconnects to a
  // server that came back (at another address, or after being declared dead): what was
  // queued for the old incarnation fails with kUnavailable and its incarnation is bumped.
  void ApplyView(const msg::ClusterView& view);

  // Blocks until `server` has an incarnation other than `old` or is alive again, the links
  // are closed, or `deadline`. True when the server is back (and the links are not closed).
  bool WaitForNewIncarnation(int server, uint64_t old, absl::Time deadline) const;

  // The worker stopped or the cluster shut down: wakes every WaitForNewIncarnation.
  void Close();

  // Called on the I/O thread with a server's rank each time it came back (after the
  // requests to its old incarnation failed); must not block. Any thread; null: none.
  void SetOnRestart(std::function<void(int server)> on_restart);

 private:
  Transport* const transport_;
  const RoleLog* const log_;
  mutable absl::Mutex mu_;
  std::vector<int> peer_ ABSL_GUARDED_BY(mu_);  // changes when a server moves
  std::vector<uint64_t> incarnation_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> restartable_ ABSL_GUARDED_BY(mu_);
  // Not declared dead (false from the view saying so until it is back).
  std::vector<bool> alive_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(int)> on_restart_ ABSL_GUARDED_BY(mu_);
  // I/O thread only (ADAPS_DCHECK_ON_IO_THREAD).
  std::vector<std::string> address_;
  std::vector<uint64_t> instance_;  // NodeInfo.instance of each server's process (0: unknown)
  std::vector<bool> dead_;
};

}  // namespace adaps

#endif  // ADAPS_WORKER_SERVER_LINKS_H_
