#pragma once
// The tracker's prefetch job store, pure logic (callers pass "now"): agents that poll for work
// (node name, agent id, labels; silent ones count as gone after agent_ttl), jobs that prefetch
// images on a selection of those nodes (all, by name, by label selector, a percentage picked by
// rendezvous hashing of node names), each node's progress as its agent reports it, and bounds.
// tracker/prefetch/prefetch_api.h serves it as JSON.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "tracker/swarms/swarm_table.h"  // TimePoint

namespace shoal::tracker {

struct PrefetchJobsOptions {
  std::chrono::seconds agent_ttl{30};     // an agent not heard from this long is gone
  size_t max_jobs = 256;                  // jobs kept, running or ended
  std::chrono::seconds keep_ended{3600};  // an ended job is kept this long
  size_t max_agents = 100'000;
};

// An agent as its last poll described it.
struct PrefetchAgent {
  std::string node;
  std::string agent;  // agent id (changes when the agent restarts)
  std::map<std::string, std::string> labels;
  TimePoint last_seen;
  // Where its swarm listens as the tracker's swarms see it: the poll's TCP source address and the
  // swarm port the poll reported (absent when it reported none). It names the node behind those
  // swarm peers in the cluster view.
  std::optional<PeerEndpoint> peer;
};

// What to prefetch and where. An empty selection (no nodes, no selector, no percent) is all
// live agents.
struct PrefetchSpec {
  std::vector<std::string> images;
  std::string platform = "linux/amd64";
  int64_t ttl_s = 86400;  // pins; 0 = until unpinned
  int parallel = 4;
  bool snapshots = false;  // also extract the layers for containerd's snapshotter on each node
  std::vector<std::string> nodes;               // only these (named nodes need not be live)
  std::map<std::string, std::string> selector;  // only nodes with all these labels
  std::optional<int> percent;                   // then this share of them, at least one
  std::optional<std::chrono::seconds> timeout;  // nodes not done by then fail
};

enum class PrefetchNodeState { kPending, kRunning, kDone, kFailed };

// One node's part of a job.
struct PrefetchNode {
  std::string node;
  PrefetchNodeState state = PrefetchNodeState::kPending;
  std::string agent;  // the agent that took it
  std::string error;
  uint64_t bytes_done = 0, bytes_total = 0, blobs_done = 0, blobs_total = 0;
  std::optional<TimePoint> started, ended;
  bool Ended() const {
    return state == PrefetchNodeState::kDone || state == PrefetchNodeState::kFailed;
  }
};

struct PrefetchJobRecord {
  std::string id;
  PrefetchSpec spec;
  TimePoint created;
  std::optional<TimePoint> deadline;
  std::vector<PrefetchNode> nodes;  // sorted by node name
  uint64_t version = 1;             // bumped on every change
  std::optional<TimePoint> ended;
  bool ok = false;  // ended with every node done
};

// A job handed to a node's agent.
struct PrefetchAssignment {
  std::string id;
  std::vector<std::string> images;
  std::string platform;
  int64_t ttl_s = 0;
  int parallel = 4;
  bool snapshots = false;
};

// An agent's report on its part of a job.
struct PrefetchReport {
  std::string agent;
  PrefetchNodeState state = PrefetchNodeState::kRunning;
  std::string error;
  uint64_t bytes_done = 0, bytes_total = 0, blobs_done = 0, blobs_total = 0;
};

enum class PrefetchErrc { kNotFound, kNoNodes, kFull, kConflict };
struct PrefetchError {
  PrefetchErrc code;
  std::string message;
};

// Not thread-safe: one owner thread.
class PrefetchJobs {
 public:
  // seed feeds job ids.
  explicit PrefetchJobs(PrefetchJobsOptions options, uint64_t seed = std::random_device{}());

  // Records a poll from node's agent, whose swarm listens at `peer` (if it said). A different
  // agent id for a known node means the agent restarted: its running parts fail (their job ids
  // are added to *changed). Errors: kFull when max_agents agents are known and node is not one
  // of them.
  std::optional<PrefetchError> Heartbeat(const std::string& node, const std::string& agent,
                                         std::map<std::string, std::string> labels, TimePoint now,
                                         std::vector<std::string>* changed,
                                         std::optional<PeerEndpoint> peer = std::nullopt);
  // Agents heard from within agent_ttl, by node name.
  std::vector<PrefetchAgent> LiveAgents(TimePoint now) const;
  // Every agent still remembered, live or silent (a silent one is forgotten after 10 agent_ttl),
  // by node name.
  const std::map<std::string, PrefetchAgent>& Agents() const { return agents_; }
  // The node names spec selects among live agents (sorted). Named nodes are kept even when not
  // live (their part fails at once).
  static std::vector<std::string> Select(const std::vector<PrefetchAgent>& live,
                                         const PrefetchSpec& spec);
  // Creates a job on the selected nodes. Errors: kNoNodes when the selection is empty, kFull
  // when max_jobs jobs run.
  std::variant<const PrefetchJobRecord*, PrefetchError> Create(PrefetchSpec spec, TimePoint now);
  // Hands node's pending parts to its agent (they become running).
  std::vector<PrefetchAssignment> Take(const std::string& node, const std::string& agent,
                                       TimePoint now);
  // Whether node has a pending part.
  bool HasPending(const std::string& node) const;
  // Records a report. Errors: kNotFound (job or node not in it), kConflict (another agent took
  // it, or it already ended).
  std::optional<PrefetchError> Report(const std::string& id, const std::string& node,
                                      const PrefetchReport& report, TimePoint now);
  const PrefetchJobRecord* Find(const std::string& id) const;
  // Every job, newest first.
  std::vector<const PrefetchJobRecord*> List() const;
  // Fails the parts of gone agents and of jobs past their deadline, ends jobs, drops ended jobs
  // after keep_ended and agents silent for 10 * agent_ttl. Returns the ids of jobs that changed.
  std::vector<std::string> Sweep(TimePoint now);

  const PrefetchJobsOptions& options() const { return options_; }
  size_t running_jobs() const;
  size_t job_count() const { return jobs_.size(); }

 private:
  void Fail(PrefetchJobRecord& job, PrefetchNode& node, std::string error, TimePoint now);
  // Ends the job when every part ended.
  void MaybeEnd(PrefetchJobRecord& job, TimePoint now);

  PrefetchJobsOptions options_;
  std::mt19937_64 rng_;
  std::map<std::string, PrefetchAgent> agents_;    // by node name
  std::map<std::string, PrefetchJobRecord> jobs_;  // by id
};

// The string form of a node state: pending, running, done, failed.
const char* PrefetchNodeStateName(PrefetchNodeState state);

}  // namespace shoal::tracker
