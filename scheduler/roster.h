// The scheduler's nodes and its rank rules, without sockets: who registered (role, rank,
// route, address, liveness), which rank a registration gets (the one it claims when free,
// else the lowest free), provisional ranks before the job forms (a node that claims the rank
// it had before a scheduler restart takes it from a fresh node, which moves), a node with a
// known identity taking its rank back, workers joining the formed job (--max_workers), who a
// heartbeat comes from, who is declared dead, and when a restarted scheduler gives up
// waiting for every node to come back (--reform_timeout_ms).
//
// Owned by the Scheduler, which wires it to its messages; used only on the scheduler's I/O
// thread (the Scheduler checks), so it has no lock. Node pointers it returns stay valid
// until the next registration or join (nodes live in one vector).
#ifndef ADAPS_SCHEDULER_ROSTER_H_
#define ADAPS_SCHEDULER_ROSTER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/messages.h"
#include "scheduler/scheduler_metrics.h"

namespace adaps {

// `bytes` random bytes from the OS (std::random_device), as lower-case hex: the workers'
// secrets and a job id.
std::string RandomHex(int bytes);

class Roster {
 public:
  struct Node {
    msg::Role role = msg::Role::Unknown;
    int rank = -1;
    std::string address;
    std::string identity;
    std::string route;
    uint64_t register_request = 0;
    absl::Time last_seen;
    bool alive = true;
    bool left = false;
    // Its rank is one it claimed (it had it before this scheduler started), not one given to
    // a fresh node before the job formed, which a claim of the same rank takes over.
    bool rank_claimed = false;
    std::string secret;  // workers: random, sent only in this node's views (kept on rejoin)
    // Servers: the steps of their step checkpoints (latest Register or Heartbeat).
    std::vector<uint64_t> checkpoint_steps;
    // Servers: their --optimizer (Register.optimizer; empty if they did not say).
    std::string optimizer;
    uint64_t instance = 0;  // Register.instance: the process (NodeInfo.instance)
    // Workers: the first barrier this one takes part in (one that joined a running job does
    // not hold up the barriers the others were already waiting at).
    uint64_t first_barrier = 0;
    // Workers that joined a running job: no barrier waits for them until they call one (a
    // trainer that joins skips the start-up barriers the others may not have reached yet).
    bool barrier_seen = true;
    // Workers: take part in the steps (NodeInfo.stepping): false for one that joined the
    // running job until it declares a tensor.
    bool stepping = true;
    // Workers: the L2 norm of their residues at the latest heartbeat (-1: never reported).
    float residue_norm = -1.0f;
  };

  // The counts as SchedulerConfig's (`max_workers` 0: num_workers, nobody joins); a node
  // silent for longer than `dead_timeout` is declared dead; after a scheduler restart every
  // node is back within `reform_timeout` of the first, or the job is given up (Reforming).
  Roster(int num_servers, int num_workers, int max_workers, absl::Duration dead_timeout,
         absl::Duration reform_timeout = absl::InfiniteDuration());

  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  // Every expected node registered and was told its rank (Form).
  bool formed() const { return formed_; }
  // Every expected node is in: the job may form.
  bool complete() const;
  // The job forms: every node counts as seen `now`.
  void Form(absl::Time now);
  // A node registered at `now` saying it was in this job before (the rank or the view epoch
  // it had from an earlier scheduler): the job re-forms, by reform_timeout from the first.
  void NoteReformingNode(absl::Time now);
  // OK while the job forms or re-forms in time, or formed; kDeadlineExceeded at `now` once
  // reform_timeout passed since the first node came back and some never did, naming them
  // ("never came back: worker 1") and how many are back.
  absl::Status Reforming(absl::Time now) const;

  // A node with `identity` (non-empty) and `fresh.role` takes its rank back: it gets
  // `fresh`'s route, address, checkpoint steps, register request and time, its optimizer
  // when `fresh` names one, and is alive again. `node` is null when no node has it.
  struct Rejoined {
    Node* node = nullptr;
    bool was_dead = false;  // dead or left before (announced as one that came back)
    bool moved = false;     // at another address than before
  };
  Rejoined Rejoin(const Node& fresh);

  // A registration of a node whose identity no node has (or none), claiming rank `claimed`
  // (-1: none). Before the job forms it gets the rank it claims when free, else the lowest
  // free; a claimed rank held provisionally by a fresh node is taken from it, and it moves to
  // the lowest free one (`moved`). Once the job formed, a worker joins while fewer than
  // max_workers are live: a new secret, barriers from `first_barrier` on, steps from its
  // first declaration.
  struct Admission {
    enum class Outcome {
      kAdded,    // `node` has its rank; `moved` (or null) the fresh node it took it from
      kJoined,   // `node` joined the formed job
      kHeld,     // a worker beyond num_workers, within max_workers, before the job formed:
                 // the caller keeps its message and registers it again once it forms
      kRefused,  // `refusal` (kFailedPrecondition) says why: every rank is taken
    } outcome = Outcome::kRefused;
    Node* node = nullptr;
    Node* moved = nullptr;
    absl::Status refusal;
  };
  Admission Admit(Node fresh, int claimed, uint64_t first_barrier);

  // The rank for a new node of `role`: `claimed` when it is in [0, want) and free, else the
  // lowest free.
  int PickRank(msg::Role role, int claimed, int want) const;

  Node* Find(msg::Role role, int rank);
  // Before the job forms: the node of `role` that registered on connection `route` (it
  // registers again when that connection closed before the view came), else null.
  Node* RegisteredBeforeForming(msg::Role role, const std::string& route);
  // The node that sent a heartbeat claiming `role` and `rank` on connection `route`, or why
  // it is refused: kFailedPrecondition "register again" when it claims a rank a fresh node
  // holds provisionally (its claim will win), or for no such node or a dead one;
  // kPermissionDenied from another connection than the node's; kAborted for a node declared
  // dead that has no identity to take its rank back.
  absl::StatusOr<Node*> FromHeartbeat(msg::Role role, int rank, const std::string& route);
  // The registered node of `role` and `rank` that sent on the connection it registered with
  // (`route`); null for anyone else (a forger claiming a rank).
  Node* Authenticated(msg::Role role, int rank, const std::string& route);

  // Declares dead every live node silent for longer than dead_timeout at `now`; returns them.
  std::vector<Node*> DeclareSilentDead(absl::Time now);
  // A worker that is dead (and did not leave); null: none.
  const Node* DeadWorker() const;
  // The nodes that are dead (and did not leave), e.g. "Server 1, Worker 0"; empty: none.
  std::string DeadNodes() const;

  int AliveWorkers() const;
  // The workers' ranks the views announce: one past the highest (joined ones included).
  int WorkerRanks() const;
  SchedulerMetrics::NodeCounts Counts(msg::Role role) const;

 private:
  int Want(msg::Role role) const;
  Admission Register(Node fresh, int claimed);
  Admission Join(const Node& fresh, int claimed, uint64_t first_barrier);

  const int num_servers_;
  const int num_workers_;
  const int max_workers_;
  const absl::Duration dead_timeout_;
  const absl::Duration reform_timeout_;
  std::vector<Node> nodes_;
  bool formed_ = false;
  std::optional<absl::Time> reform_since_;  // the first NoteReformingNode before forming
  int held_ = 0;  // workers held before the job formed (Admission::Outcome::kHeld)
};

}  // namespace adaps

#endif  // ADAPS_SCHEDULER_ROSTER_H_
