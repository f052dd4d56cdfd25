#pragma once
// Long-polling lease requests parked until something that could change their answer happens:
// a change to their blob's table, or (for requests held back by a cap) a lease ending anywhere.
// Each waiter is one steady_timer that a wake-up cancels: no polling, no busy loop.

#include <utility>

#include <cstddef>
#include <list>
#include <memory>
#include <unordered_map>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "lib/core/digest.h"
#include "tracker/swarms/swarm_table.h"

namespace shoal::tracker {

// Not thread-safe: Wait and the Wake calls must run on one single-threaded io_context. Callers
// check their condition, then Wait; nothing changes in between because the thread is not shared.
// Waiters still parked when this object is destroyed stay valid (they share its state).
class LeaseWaiters {
 public:
  LeaseWaiters();

  // Suspends until WakeBlob(digest), WakeCapWaiters() when cap_waiter, WakeAll(), or until.
  // Runs on the calling coroutine's executor.
  boost::asio::awaitable<void> Wait(const Digest& digest, bool cap_waiter, TimePoint until);
  // Wakes the waiters of digest's table.
  void WakeBlob(const Digest& digest);
  // Wakes the waiters held back by the cluster or per-agent lease cap.
  void WakeCapWaiters();
  // Wakes everyone (shutdown).
  void WakeAll();
  // Waiters parked now.
  size_t size() const { return state_->count; }

 private:
  using Timers = std::list<boost::asio::steady_timer*>;
  struct State {
    std::unordered_map<Digest, Timers> by_blob;  // every waiter is here
    Timers cap;                                  // cap waiters are also here
    size_t count = 0;
  };
  std::shared_ptr<State> state_;
};

}  // namespace shoal::tracker
