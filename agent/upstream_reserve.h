#pragma once
// While this agent fetches chunks from upstream under a tracker lease, its downloads from peers
// are held to (1 - reserve) of its link, so that the few upstream flows of the cluster keep
// their share of the leaseholder's downlink instead of 1/(k+1) of it beside k peer connections
// (docs/benchmarks.md, "Background streams and the upstream reserve"). Off by default: in
// shoal-sim it took p99 from 1.64x to 1.27x at 250 nodes and 10 Gbit/s, but a real 6-node
// bench at B = U = 100 Mbit/s was slower with it (1.85x against 1.46x, CPU-bound here).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "lib/core/error.h"

namespace shoal::agent {

class UpstreamReserve {
  struct State {
    int64_t cap = 0;
    std::function<void(int64_t)> apply;  // cleared when the UpstreamReserve goes
    int holds = 0;
  };

 public:
  // cap_bytes_per_s: the peer download cap while any hold is out (<= 0: never cap). apply is
  // called with the cap when the first hold is taken and with 0 when the last one ends.
  UpstreamReserve(int64_t cap_bytes_per_s, std::function<void(int64_t)> apply);
  // Holds still out afterwards (coroutines destroyed later) release without calling apply.
  ~UpstreamReserve();
  UpstreamReserve(const UpstreamReserve&) = delete;
  UpstreamReserve& operator=(const UpstreamReserve&) = delete;

  // Held for the time of one upstream fetch; movable, released when destroyed.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&&) noexcept = default;
    Hold& operator=(Hold&& o) noexcept;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { Release(); }
    void Release();

   private:
    friend class UpstreamReserve;
    explicit Hold(std::shared_ptr<State> state) : state_(std::move(state)) {}
    std::shared_ptr<State> state_;
  };

  Hold Acquire();
  int holds() const { return state_->holds; }
  int64_t cap() const { return state_->cap; }

 private:
  std::shared_ptr<State> state_;
};

// The interface of the IPv4 default route in a /proc/net/route table (its first default
// entry); kNotFound when there is none.
Result<std::string> DefaultRouteInterface(const std::string& route_table);
// The link speed of interface iface in Mbit/s from sys_class_net/<iface>/speed (e.g.
// /sys/class/net); kNotFound when the file is missing or the driver reports none (-1, 0, as
// virtual and down links do).
Result<int64_t> LinkMbit(const std::string& sys_class_net, const std::string& iface);
// LinkMbit of this host's default route interface (/proc/net/route, /sys/class/net).
Result<int64_t> DefaultRouteLinkMbit();

}  // namespace shoal::agent
