#include "tracker/lease_waiters.h"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace shoal::tracker {
namespace asio = boost::asio;

namespace {

// Registers a timer for the lifetime of one wait. The destructor also runs when the coroutine
// frame is destroyed without resuming (io_context torn down), hence the shared state.
template <typename State>
class Registration {
 public:
  Registration(std::shared_ptr<State> state, const Digest& digest, bool cap_waiter,
               asio::steady_timer* timer)
      : state_(std::move(state)), digest_(digest) {
    auto& list = state_->by_blob[digest_];
    blob_it_ = list.insert(list.end(), timer);
    if (cap_waiter) cap_it_ = state_->cap.insert(state_->cap.end(), timer);
    has_cap_ = cap_waiter;
    ++state_->count;
  }
  ~Registration() {
    auto it = state_->by_blob.find(digest_);
    it->second.erase(blob_it_);
    if (it->second.empty()) state_->by_blob.erase(it);
    if (has_cap_) state_->cap.erase(cap_it_);
    --state_->count;
  }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

 private:
  std::shared_ptr<State> state_;
  Digest digest_;
  std::list<asio::steady_timer*>::iterator blob_it_;
  std::list<asio::steady_timer*>::iterator cap_it_;
  bool has_cap_ = false;
};

}  // namespace

LeaseWaiters::LeaseWaiters() : state_(std::make_shared<State>()) {}

asio::awaitable<void> LeaseWaiters::Wait(const Digest& digest, bool cap_waiter, TimePoint until) {
  auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  timer.expires_at(until);
  Registration<State> registration(state_, digest, cap_waiter, &timer);
  boost::system::error_code ec;  // operation_aborted is the wake-up
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

void LeaseWaiters::WakeBlob(const Digest& digest) {
  auto it = state_->by_blob.find(digest);
  if (it == state_->by_blob.end()) return;
  for (asio::steady_timer* t : it->second) t->cancel();
}

void LeaseWaiters::WakeCapWaiters() {
  for (asio::steady_timer* t : state_->cap) t->cancel();
}

void LeaseWaiters::WakeAll() {
  for (auto& [digest, timers] : state_->by_blob) {
    for (asio::steady_timer* t : timers) t->cancel();
  }
}

}  // namespace shoal::tracker
