#include "tests/sim/flow_model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <queue>
#include <stdexcept>
#include <utility>

namespace shoal::sim {

LinkId FlowModel::AddLink(double capacity) {
  if (!(capacity > 0)) throw std::invalid_argument("link capacity must be > 0");
  links_.push_back(Link{});
  links_.back().capacity = capacity;
  return static_cast<LinkId>(links_.size() - 1);
}

void FlowModel::SetCapacity(LinkId l, double capacity) {
  if (!(capacity > 0)) throw std::invalid_argument("link capacity must be > 0");
  links_.at(l).capacity = capacity;
  dirty_ = true;
}

FlowId FlowModel::AddFlow(const std::vector<LinkId>& links, double cap) {
  if (links.empty() || links.size() > 3) throw std::invalid_argument("a flow crosses 1-3 links");
  FlowId f;
  if (!free_.empty()) {
    f = free_.back();
    free_.pop_back();
  } else {
    f = static_cast<FlowId>(flows_.size());
    flows_.emplace_back();
  }
  Flow& fl = flows_[f];
  fl = Flow{};
  fl.alive = true;
  fl.cap = cap;
  fl.nlinks = static_cast<uint8_t>(links.size());
  double spare = cap;
  for (size_t i = 0; i < links.size(); ++i) {
    Link& l = links_.at(links[i]);
    fl.links[i] = links[i];
    fl.slot[i] = static_cast<uint32_t>(l.flows.size());
    l.flows.push_back(f);
    spare = std::min(spare, std::max(0.0, l.capacity - l.used));
  }
  SetRate(f, spare);
  ++live_;
  dirty_ = true;
  return f;
}

void FlowModel::RemoveFlow(FlowId f) {
  Flow& fl = flows_.at(f);
  if (!fl.alive) return;
  SetRate(f, 0);
  for (int i = 0; i < fl.nlinks; ++i) {
    Link& l = links_[fl.links[i]];
    uint32_t s = fl.slot[i];
    FlowId last = l.flows.back();
    l.flows[s] = last;
    l.flows.pop_back();
    if (last != f) {
      Flow& lf = flows_[last];
      for (int j = 0; j < lf.nlinks; ++j) {
        if (lf.links[j] == fl.links[i]) lf.slot[j] = s;
      }
    }
  }
  fl.alive = false;
  free_.push_back(f);
  --live_;
  dirty_ = true;
}

void FlowModel::SetRate(FlowId f, double r) {
  Flow& fl = flows_[f];
  for (int i = 0; i < fl.nlinks; ++i) links_[fl.links[i]].used += r - fl.rate;
  fl.rate = r;
}

void FlowModel::Recompute(std::vector<FlowId>* changed) {
  ++recomputes_;
  dirty_ = false;
  using Entry = std::pair<double, LinkId>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  for (LinkId l = 0; l < links_.size(); ++l) {
    Link& link = links_[l];
    link.left = link.capacity;
    link.open = static_cast<uint32_t>(link.flows.size());
    if (link.open > 0) heap.emplace(link.left / link.open, l);
  }
  std::vector<FlowId> capped;
  for (FlowId f = 0; f < flows_.size(); ++f) {
    flows_[f].frozen = !flows_[f].alive;
    if (flows_[f].alive && flows_[f].cap < kUnlimited) capped.push_back(f);
  }
  std::sort(capped.begin(), capped.end(),
            [&](FlowId a, FlowId b) { return flows_[a].cap < flows_[b].cap; });
  size_t next_cap = 0;
  std::vector<double> rates(flows_.size(), 0.0);
  auto freeze = [&](FlowId f, double r) {
    Flow& fl = flows_[f];
    fl.frozen = true;
    rates[f] = r;
    for (int i = 0; i < fl.nlinks; ++i) {
      Link& m = links_[fl.links[i]];
      m.left = std::max(0.0, m.left - r);
      --m.open;
      // No push: m's entry in the heap keeps its old, lower share and is re-queued with the
      // current one when it comes up (shares only grow), so each link has one entry at a time.
    }
  };
  for (;;) {
    while (next_cap < capped.size() && flows_[capped[next_cap]].frozen) ++next_cap;
    // The lowest valid link share.
    double share = kUnlimited;
    LinkId bottleneck = 0;
    while (!heap.empty()) {
      auto [s, l] = heap.top();
      const Link& link = links_[l];
      if (link.open == 0) {
        heap.pop();
        continue;
      }
      double cur = link.left / link.open;
      if (cur > s * (1 + 1e-12) + 1e-300) {  // stale (shares only grow): re-queue
        heap.pop();
        heap.emplace(cur, l);
        continue;
      }
      share = cur;
      bottleneck = l;
      break;
    }
    if (next_cap < capped.size() && flows_[capped[next_cap]].cap <= share) {
      FlowId f = capped[next_cap++];
      freeze(f, flows_[f].cap);
      continue;
    }
    if (share == kUnlimited) break;
    heap.pop();
    // Freeze every open flow on the bottleneck at its share (copy: freeze edits open counts).
    std::vector<FlowId> on = links_[bottleneck].flows;
    for (FlowId f : on) {
      if (!flows_[f].frozen) freeze(f, share);
    }
  }
  for (auto& link : links_) link.used = 0;
  for (FlowId f = 0; f < flows_.size(); ++f) {
    Flow& fl = flows_[f];
    if (!fl.alive) continue;
    if (changed != nullptr && std::fabs(rates[f] - fl.rate) > 1e-9 * std::max(1.0, fl.rate))
      changed->push_back(f);
    fl.rate = rates[f];
    for (int i = 0; i < fl.nlinks; ++i) links_[fl.links[i]].used += fl.rate;
  }
}

}  // namespace shoal::sim
