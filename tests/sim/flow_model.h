#pragma once
// A flow-level network model for shoal-sim: links with a capacity (bytes/s) and flows that each
// cross a few links (a peer flow: the source's uplink and the receiver's downlink; an upstream
// flow: the shared NAT link and the receiver's downlink), optionally with a rate cap of their
// own (a TCP window over the round trip). Rates are max-min fair, as TCP-like sharing between
// long flows tends to be: computed exactly by Recompute() (progressive filling). Between two
// Recompute() calls a new flow gets what is left over on its links (never more than the
// capacity), and a removed flow's rate is simply freed; the simulator recomputes at events,
// at most once per quantum, so that many piece events in a row do not each cost a full solve.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace shoal::sim {

using LinkId = uint32_t;
using FlowId = uint32_t;
constexpr double kUnlimited = std::numeric_limits<double>::infinity();
constexpr FlowId kNoFlow = std::numeric_limits<FlowId>::max();

class FlowModel {
 public:
  // A link of capacity bytes/s (> 0).
  LinkId AddLink(double capacity);
  double capacity(LinkId l) const { return links_[l].capacity; }
  // Sum of the rates of the flows on l now.
  double used(LinkId l) const { return links_[l].used; }
  size_t flows_on(LinkId l) const { return links_[l].flows.size(); }
  // Changes l's capacity (> 0); the flows on it keep their rates until the next Recompute().
  void SetCapacity(LinkId l, double capacity);

  // A new flow over links (1 to 3 distinct links) with its own cap (kUnlimited: none). Its
  // rate until the next Recompute() is the spare capacity of its tightest link (maybe 0).
  FlowId AddFlow(const std::vector<LinkId>& links, double cap = kUnlimited);
  // Frees flow f (its id may be reused by a later AddFlow).
  void RemoveFlow(FlowId f);
  bool alive(FlowId f) const { return f < flows_.size() && flows_[f].alive; }
  double rate(FlowId f) const { return flows_[f].rate; }
  size_t flow_count() const { return live_; }

  // Max-min fair rates for every live flow. Appends the flows whose rate changed to *changed
  // (if not null). Clears dirty().
  void Recompute(std::vector<FlowId>* changed = nullptr);
  // Whether flows were added or removed since the last Recompute().
  bool dirty() const { return dirty_; }
  uint64_t recomputes() const { return recomputes_; }

 private:
  struct Link {
    double capacity = 0;
    double used = 0;
    std::vector<FlowId> flows;
    // Scratch for Recompute.
    double left = 0;
    uint32_t open = 0;
  };
  struct Flow {
    bool alive = false;
    uint8_t nlinks = 0;
    LinkId links[3] = {0, 0, 0};
    uint32_t slot[3] = {0, 0, 0};  // index in links_[links[i]].flows
    double cap = kUnlimited;
    double rate = 0;
    bool frozen = false;  // scratch for Recompute
  };
  void SetRate(FlowId f, double r);

  std::vector<Link> links_;
  std::vector<Flow> flows_;
  std::vector<FlowId> free_;
  size_t live_ = 0;
  bool dirty_ = false;
  uint64_t recomputes_ = 0;
};

}  // namespace shoal::sim
