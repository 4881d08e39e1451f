#include "scheduler/roster.h"

#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"

namespace adaps {

std::string RandomHex(int bytes) {
  std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    const unsigned b = rd() & 0xff;
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

Roster::Roster(int num_servers, int num_workers, int max_workers, absl::Duration dead_timeout,
               absl::Duration reform_timeout)
    : num_servers_(num_servers),
      num_workers_(num_workers),
      max_workers_(max_workers),
      dead_timeout_(dead_timeout),
      reform_timeout_(reform_timeout) {}

int Roster::Want(msg::Role role) const {
  return role == msg::Role::Server ? num_servers_ : num_workers_;
}

bool Roster::complete() const {
  return static_cast<int>(nodes_.size()) == num_servers_ + num_workers_;
}

void Roster::Form(absl::Time now) {
  formed_ = true;
  held_ = 0;  // the held workers join now (the caller registers them again)
  for (auto& n : nodes_) n.last_seen = now;
}

void Roster::NoteReformingNode(absl::Time now) {
  if (!formed_ && !reform_since_) reform_since_ = now;
}

absl::Status Roster::Reforming(absl::Time now) const {
  if (formed_ || !reform_since_ || now - *reform_since_ <= reform_timeout_) {
    return absl::OkStatus();
  }
  // The expected ranks nobody holds. (A fresh node's provisional rank counts as held: a node
  // that had it before would have claimed it.)
  std::string missing;
  for (msg::Role role : {msg::Role::Server, msg::Role::Worker}) {
    for (int rank = 0; rank < Want(role); ++rank) {
      if (std::none_of(nodes_.begin(), nodes_.end(), [&](const Node& n) {
            return n.role == role && n.rank == rank;
          })) {
        absl::StrAppend(&missing, missing.empty() ? "" : ", ",
                        role == msg::Role::Server ? "server " : "worker ", rank);
      }
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the job did not re-form after the scheduler restarted: ", nodes_.size(), " of ",
      num_servers_ + num_workers_, " nodes registered again within --reform_timeout_ms (",
      absl::FormatDuration(reform_timeout_), " from the first); never came back: ", missing));
}

Roster::Rejoined Roster::Rejoin(const Node& fresh) {
  for (auto& n : nodes_) {
    if (n.identity != fresh.identity || n.role != fresh.role) continue;
    Rejoined r;
    r.node = &n;
    r.moved = n.address != fresh.address;
    n.route = fresh.route;
    n.address = fresh.address;
    n.checkpoint_steps = fresh.checkpoint_steps;
    if (!fresh.optimizer.empty()) n.optimizer = fresh.optimizer;
    n.instance = fresh.instance;
    n.register_request = fresh.register_request;
    n.last_seen = fresh.last_seen;
    // One that had left (a script that stopped its worker as it failed) is announced as one
    // that died: the servers count it again only from the view that says it is back.
    r.was_dead = !n.alive || n.left;
    n.alive = true;
    n.left = false;
    return r;
  }
  return {};
}

Roster::Admission Roster::Admit(Node fresh, int claimed, uint64_t first_barrier) {
  if (!formed_) return Register(std::move(fresh), claimed);
  if (fresh.role == msg::Role::Worker) {
    Admission joined = Join(fresh, claimed, first_barrier);
    if (joined.outcome == Admission::Outcome::kJoined) return joined;
  }
  Admission r;
  r.refusal = absl::FailedPreconditionError(
      fresh.role == msg::Role::Server
          ? std::string("cluster already complete (every server rank is taken)")
      : max_workers_ > num_workers_
          ? absl::StrCat("cluster already complete: ", AliveWorkers(),
                         " live workers, --max_workers=", max_workers_)
          : absl::StrCat("cluster already complete: the job runs ", num_workers_,
                         " workers (start the scheduler with --max_workers to let workers "
                         "join a running job)"));
  return r;
}

Roster::Admission Roster::Register(Node fresh, int claimed) {
  const int want = Want(fresh.role);
  const int have = static_cast<int>(std::count_if(
      nodes_.begin(), nodes_.end(), [&](const Node& n) { return n.role == fresh.role; }));
  Admission r;
  if (have >= want && fresh.role == msg::Role::Worker && num_workers_ + held_ < max_workers_) {
    // Elastic: more workers than the job starts with came at once; they join once it forms.
    ++held_;
    r.outcome = Admission::Outcome::kHeld;
    return r;
  }
  if (have >= want) {
    r.refusal = absl::FailedPreconditionError(
        absl::StrCat("already have ", want, " ", msg::EnumNameRole(fresh.role), "s"));
    return r;
  }
  // Before the job forms no node has been told its rank: a node that claims the rank it had
  // before this scheduler started (a survivor of a scheduler restart) takes it from a fresh
  // node given it meanwhile (a server restarted at the same time), which moves to a free one.
  auto provisional = std::find_if(nodes_.begin(), nodes_.end(), [&](const Node& n) {
    return n.role == fresh.role && n.rank == claimed && claimed >= 0 && !n.rank_claimed;
  });
  const bool moves = provisional != nodes_.end();
  const size_t moved = moves ? provisional - nodes_.begin() : 0;
  if (moves) nodes_[moved].rank = -1;
  fresh.rank = PickRank(fresh.role, claimed, want);
  fresh.rank_claimed = claimed >= 0 && fresh.rank == claimed;
  if (fresh.role == msg::Role::Worker) fresh.secret = RandomHex(16);
  nodes_.push_back(std::move(fresh));
  if (moves) {
    Node& m = nodes_[moved];
    m.rank = PickRank(m.role, -1, want);
    r.moved = &m;
  }
  r.outcome = Admission::Outcome::kAdded;
  r.node = &nodes_.back();
  return r;
}

Roster::Admission Roster::Join(const Node& fresh, int claimed, uint64_t first_barrier) {
  const int bound = std::max(max_workers_, num_workers_);
  if (AliveWorkers() >= bound) return {};
  Node node;
  node.role = msg::Role::Worker;
  node.rank = PickRank(msg::Role::Worker, claimed, bound);
  node.identity = fresh.identity;
  node.secret = RandomHex(16);
  node.route = fresh.route;
  node.register_request = fresh.register_request;
  node.last_seen = fresh.last_seen;
  node.first_barrier = first_barrier;
  node.barrier_seen = false;
  node.stepping = false;
  nodes_.push_back(std::move(node));
  Admission r;
  r.outcome = Admission::Outcome::kJoined;
  r.node = &nodes_.back();
  return r;
}

int Roster::PickRank(msg::Role role, int claimed, int want) const {
  // A node re-registering with a restarted scheduler keeps the rank it had.
  if (claimed >= 0 && claimed < want &&
      std::none_of(nodes_.begin(), nodes_.end(), [&](const Node& n) {
        return n.role == role && n.rank == claimed;
      })) {
    return claimed;
  }
  std::set<int> taken;
  for (const auto& n : nodes_) {
    if (n.role == role) taken.insert(n.rank);
  }
  int rank = 0;
  while (taken.count(rank)) ++rank;
  return rank;
}

Roster::Node* Roster::RegisteredBeforeForming(msg::Role role, const std::string& route) {
  if (formed_ || route.empty()) return nullptr;
  for (Node& n : nodes_) {
    if (n.role == role && n.route == route && n.alive) return &n;
  }
  return nullptr;
}

Roster::Node* Roster::Find(msg::Role role, int rank) {
  for (auto& n : nodes_) {
    if (n.role == role && n.rank == rank && rank >= 0) return &n;
  }
  return nullptr;
}

Roster::Node* Roster::Authenticated(msg::Role role, int rank, const std::string& route) {
  Node* node = Find(role, rank);
  return node != nullptr && node->route == route ? node : nullptr;
}

absl::StatusOr<Roster::Node*> Roster::FromHeartbeat(msg::Role role, int rank,
                                                    const std::string& route) {
  Node* claimed = Find(role, rank);
  Node* node = Authenticated(role, rank, route);
  if (claimed != nullptr && node == nullptr && !formed_ && !claimed->rank_claimed) {
    // A node that had this rank before this scheduler started, while a fresh node holds it
    // provisionally (nobody has been told a rank yet): its claim will win; register.
    return absl::FailedPreconditionError("register again: ranks are settled when the job forms");
  }
  if (claimed != nullptr && node == nullptr) {
    // Someone else claims a registered node's rank: refuse, and keep the node's route.
    return absl::PermissionDeniedError(absl::StrCat("heartbeat for ",
                                                    msg::EnumNameRole(claimed->role), " ",
                                                    claimed->rank, " from another connection"));
  }
  if (node != nullptr && !node->alive && node->identity.empty()) {
    // It was declared dead and cannot take its rank back (no identity): tell it so.
    return absl::AbortedError(absl::StrCat("this node was declared dead after ",
                                           absl::FormatDuration(dead_timeout_),
                                           " of silence; the cluster went on without it"));
  }
  if (node == nullptr || !node->alive) {
    return absl::FailedPreconditionError("unknown or dead node; register again");
  }
  return node;
}

std::vector<Roster::Node*> Roster::DeclareSilentDead(absl::Time now) {
  std::vector<Node*> dead;
  for (auto& n : nodes_) {
    if (n.alive && !n.left && now - n.last_seen > dead_timeout_) {
      n.alive = false;
      dead.push_back(&n);
    }
  }
  return dead;
}

const Roster::Node* Roster::DeadWorker() const {
  for (const auto& n : nodes_) {
    if (n.role == msg::Role::Worker && !n.alive && !n.left) return &n;
  }
  return nullptr;
}

std::string Roster::DeadNodes() const {
  std::string dead;
  for (const auto& n : nodes_) {
    if (n.alive || n.left) continue;
    absl::StrAppend(&dead, dead.empty() ? "" : ", ", msg::EnumNameRole(n.role), " ", n.rank);
  }
  return dead;
}

int Roster::AliveWorkers() const {
  int n = 0;
  for (const auto& node : nodes_) {
    n += node.role == msg::Role::Worker && node.alive && !node.left;
  }
  return n;
}

int Roster::WorkerRanks() const {
  int ranks = num_workers_;
  for (const auto& n : nodes_) {
    if (n.role == msg::Role::Worker) ranks = std::max(ranks, n.rank + 1);
  }
  return ranks;
}

SchedulerMetrics::NodeCounts Roster::Counts(msg::Role role) const {
  SchedulerMetrics::NodeCounts counts;
  for (const auto& n : nodes_) {
    if (n.role != role) continue;
    if (n.left) {
      ++counts.left;
    } else if (n.alive) {
      ++counts.live;
    } else {
      ++counts.dead;
    }
  }
  return counts;
}

}  // namespace adaps
