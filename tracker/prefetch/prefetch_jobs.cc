#include "tracker/prefetch/prefetch_jobs.h"

#include <algorithm>

#include <fmt/format.h>

#include "lib/core/sha256.h"

namespace shoal::tracker {

namespace {

// The rendezvous score of a node for percentage picks: the same nodes are picked for the same
// share, and growing the share only adds nodes.
uint64_t PickScore(const std::string& node) {
  return std::stoull(Sha256::Of("prefetch|" + node).hex().substr(0, 16), nullptr, 16);
}

int64_t Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}

}  // namespace

const char* PrefetchNodeStateName(PrefetchNodeState state) {
  switch (state) {
    case PrefetchNodeState::kPending:
      return "pending";
    case PrefetchNodeState::kRunning:
      return "running";
    case PrefetchNodeState::kDone:
      return "done";
    case PrefetchNodeState::kFailed:
      return "failed";
  }
  return "failed";
}

PrefetchJobs::PrefetchJobs(PrefetchJobsOptions options, uint64_t seed)
    : options_(options), rng_(seed) {}

std::optional<PrefetchError> PrefetchJobs::Heartbeat(
    const std::string& node, const std::string& agent, std::map<std::string, std::string> labels,
    TimePoint now, std::vector<std::string>* changed, std::optional<PeerEndpoint> peer) {
  auto it = agents_.find(node);
  if (it == agents_.end()) {
    if (agents_.size() >= options_.max_agents) {
      return PrefetchError{PrefetchErrc::kFull,
                           fmt::format("{} agents are registered already", agents_.size())};
    }
    it = agents_.emplace(node, PrefetchAgent{node, agent, {}, now, std::nullopt}).first;
  } else if (it->second.agent != agent) {
    // The node's agent restarted: what the old one was running is lost.
    for (auto& [id, job] : jobs_) {
      for (auto& part : job.nodes) {
        if (part.node == node && part.state == PrefetchNodeState::kRunning && part.agent != agent) {
          Fail(job, part,
               "the agent on node " + node + " restarted (was " + part.agent + ", now " + agent +
                   ")",
               now);
          if (changed) changed->push_back(id);
        }
      }
    }
    it->second.agent = agent;
  }
  it->second.labels = std::move(labels);
  it->second.last_seen = now;
  it->second.peer = peer;
  return std::nullopt;
}

std::vector<PrefetchAgent> PrefetchJobs::LiveAgents(TimePoint now) const {
  std::vector<PrefetchAgent> out;
  for (const auto& [node, a] : agents_) {
    if (now - a.last_seen < options_.agent_ttl) out.push_back(a);
  }
  return out;
}

std::vector<std::string> PrefetchJobs::Select(const std::vector<PrefetchAgent>& live,
                                              const PrefetchSpec& spec) {
  std::vector<std::string> chosen;
  if (!spec.nodes.empty()) {
    chosen = spec.nodes;
    // Named nodes that are live must also match the selector; unknown ones stay (and fail).
    std::erase_if(chosen, [&](const std::string& name) {
      for (const auto& a : live) {
        if (a.node != name) continue;
        for (const auto& [k, v] : spec.selector) {
          auto l = a.labels.find(k);
          if (l == a.labels.end() || l->second != v) return true;
        }
      }
      return false;
    });
  } else {
    for (const auto& a : live) {
      bool match = std::all_of(spec.selector.begin(), spec.selector.end(), [&](const auto& kv) {
        auto l = a.labels.find(kv.first);
        return l != a.labels.end() && l->second == kv.second;
      });
      if (match) chosen.push_back(a.node);
    }
  }
  std::sort(chosen.begin(), chosen.end());
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  if (spec.percent && !chosen.empty()) {
    size_t want = (chosen.size() * static_cast<size_t>(*spec.percent) + 99) / 100;
    std::vector<std::pair<uint64_t, std::string>> scored;
    for (const auto& n : chosen) scored.emplace_back(PickScore(n), n);
    std::sort(scored.begin(), scored.end(), std::greater<>());
    chosen.clear();
    for (size_t i = 0; i < want && i < scored.size(); ++i) chosen.push_back(scored[i].second);
    std::sort(chosen.begin(), chosen.end());
  }
  return chosen;
}

size_t PrefetchJobs::running_jobs() const {
  return static_cast<size_t>(
      std::count_if(jobs_.begin(), jobs_.end(), [](const auto& kv) { return !kv.second.ended; }));
}

std::variant<const PrefetchJobRecord*, PrefetchError> PrefetchJobs::Create(PrefetchSpec spec,
                                                                           TimePoint now) {
  Sweep(now);
  const std::vector<PrefetchAgent> live = LiveAgents(now);
  std::vector<std::string> nodes = Select(live, spec);
  if (nodes.empty()) {
    return PrefetchError{
        PrefetchErrc::kNoNodes,
        fmt::format("the selection matches none of the {} agents heard from in the last {} s",
                    live.size(), options_.agent_ttl.count())};
  }
  if (jobs_.size() >= options_.max_jobs) {
    // Make room by dropping the oldest ended job.
    auto oldest = jobs_.end();
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      if (it->second.ended && (oldest == jobs_.end() || *it->second.ended < *oldest->second.ended))
        oldest = it;
    }
    if (oldest == jobs_.end()) {
      return PrefetchError{PrefetchErrc::kFull,
                           fmt::format("{} prefetch jobs are running; the limit is {}",
                                       jobs_.size(), options_.max_jobs)};
    }
    jobs_.erase(oldest);
  }
  std::string id;
  do {
    id = fmt::format("pj-{:012x}", rng_() & 0xffffffffffffull);
  } while (jobs_.count(id));
  PrefetchJobRecord job;
  job.id = id;
  job.created = now;
  if (spec.timeout) job.deadline = now + *spec.timeout;
  job.spec = std::move(spec);
  for (const auto& n : nodes) {
    PrefetchNode part;
    part.node = n;
    bool is_live =
        std::any_of(live.begin(), live.end(), [&](const PrefetchAgent& a) { return a.node == n; });
    if (!is_live) {
      part.state = PrefetchNodeState::kFailed;
      part.error = fmt::format("no agent on node {} was heard from in the last {} s", n,
                               options_.agent_ttl.count());
      part.ended = now;
    }
    job.nodes.push_back(std::move(part));
  }
  auto& stored = jobs_.emplace(id, std::move(job)).first->second;
  MaybeEnd(stored, now);
  return &stored;
}

bool PrefetchJobs::HasPending(const std::string& node) const {
  for (const auto& [id, job] : jobs_) {
    for (const auto& part : job.nodes) {
      if (part.node == node && part.state == PrefetchNodeState::kPending) return true;
    }
  }
  return false;
}

std::vector<PrefetchAssignment> PrefetchJobs::Take(const std::string& node,
                                                   const std::string& agent, TimePoint now) {
  std::vector<PrefetchAssignment> out;
  for (auto& [id, job] : jobs_) {
    for (auto& part : job.nodes) {
      if (part.node != node || part.state != PrefetchNodeState::kPending) continue;
      part.state = PrefetchNodeState::kRunning;
      part.agent = agent;
      part.started = now;
      ++job.version;
      out.push_back(PrefetchAssignment{id, job.spec.images, job.spec.platform, job.spec.ttl_s,
                                       job.spec.parallel, job.spec.snapshots});
    }
  }
  return out;
}

std::optional<PrefetchError> PrefetchJobs::Report(const std::string& id, const std::string& node,
                                                  const PrefetchReport& report, TimePoint now) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return PrefetchError{PrefetchErrc::kNotFound, "no prefetch job " + id};
  PrefetchJobRecord& job = it->second;
  auto part = std::find_if(job.nodes.begin(), job.nodes.end(),
                           [&](const PrefetchNode& p) { return p.node == node; });
  if (part == job.nodes.end()) {
    return PrefetchError{PrefetchErrc::kNotFound, "node " + node + " is not in job " + id};
  }
  if (part->Ended()) {
    return PrefetchError{PrefetchErrc::kConflict, "node " + node + "'s part of job " + id +
                                                      " ended already (" +
                                                      PrefetchNodeStateName(part->state) + ")"};
  }
  if (part->state == PrefetchNodeState::kRunning && part->agent != report.agent) {
    return PrefetchError{PrefetchErrc::kConflict,
                         "job " + id + " on node " + node + " belongs to agent " + part->agent};
  }
  if (part->state == PrefetchNodeState::kPending) {
    part->agent = report.agent;
    part->started = now;
  }
  part->state =
      report.state == PrefetchNodeState::kPending ? PrefetchNodeState::kRunning : report.state;
  part->error = report.error;
  part->bytes_done = report.bytes_done;
  part->bytes_total = report.bytes_total;
  part->blobs_done = report.blobs_done;
  part->blobs_total = report.blobs_total;
  if (part->Ended()) part->ended = now;
  ++job.version;
  MaybeEnd(job, now);
  return std::nullopt;
}

const PrefetchJobRecord* PrefetchJobs::Find(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<const PrefetchJobRecord*> PrefetchJobs::List() const {
  std::vector<const PrefetchJobRecord*> out;
  for (const auto& [id, job] : jobs_) out.push_back(&job);
  std::sort(out.begin(), out.end(), [](const auto* a, const auto* b) {
    return a->created > b->created || (a->created == b->created && a->id < b->id);
  });
  return out;
}

void PrefetchJobs::Fail(PrefetchJobRecord& job, PrefetchNode& node, std::string error,
                        TimePoint now) {
  node.state = PrefetchNodeState::kFailed;
  node.error = std::move(error);
  node.ended = now;
  ++job.version;
  MaybeEnd(job, now);
}

void PrefetchJobs::MaybeEnd(PrefetchJobRecord& job, TimePoint now) {
  if (job.ended) return;
  if (!std::all_of(job.nodes.begin(), job.nodes.end(),
                   [](const PrefetchNode& n) { return n.Ended(); })) {
    return;
  }
  job.ended = now;
  job.ok = std::all_of(job.nodes.begin(), job.nodes.end(),
                       [](const PrefetchNode& n) { return n.state == PrefetchNodeState::kDone; });
  ++job.version;
}

std::vector<std::string> PrefetchJobs::Sweep(TimePoint now) {
  std::vector<std::string> changed;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    PrefetchJobRecord& job = it->second;
    if (job.ended) {
      if (now - *job.ended >= options_.keep_ended) {
        it = jobs_.erase(it);
      } else {
        ++it;
      }
      continue;
    }
    const uint64_t before = job.version;
    for (auto& part : job.nodes) {
      if (part.Ended()) continue;
      if (job.deadline && now >= *job.deadline) {
        Fail(job, part,
             fmt::format("timed out after {} s ({})", Seconds(now - job.created),
                         PrefetchNodeStateName(part.state)),
             now);
        continue;
      }
      auto a = agents_.find(part.node);
      if (a == agents_.end() || now - a->second.last_seen >= options_.agent_ttl) {
        Fail(job, part,
             fmt::format("the agent on node {} has not been heard from for {} s", part.node,
                         a == agents_.end() ? options_.agent_ttl.count()
                                            : Seconds(now - a->second.last_seen)),
             now);
      }
    }
    if (job.version != before) changed.push_back(it->first);
    ++it;
  }
  for (auto it = agents_.begin(); it != agents_.end();) {
    if (now - it->second.last_seen >= 10 * options_.agent_ttl) {
      it = agents_.erase(it);
    } else {
      ++it;
    }
  }
  return changed;
}

}  // namespace shoal::tracker
