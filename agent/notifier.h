#pragma once
// A condition variable for coroutines on a single-threaded io_context.

#include <utility>

#include <chrono>
#include <list>
#include <memory>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace shoal::agent {

// Not thread-safe: Wait and NotifyAll must run on the same single thread. Callers check their
// condition, then Wait; nothing can change in between because the thread is not shared.
class Notifier {
 public:
  explicit Notifier(boost::asio::any_io_executor ex) : ex_(std::move(ex)) {}

  // Suspends until the next NotifyAll or until timeout passes.
  boost::asio::awaitable<void> Wait(
      std::chrono::steady_clock::duration timeout = std::chrono::hours(24)) {
    auto timer = std::make_shared<boost::asio::steady_timer>(ex_);
    timer->expires_after(timeout);
    auto it = waiters_.insert(waiters_.end(), timer);
    boost::system::error_code ec;
    co_await timer->async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
    waiters_.erase(it);
  }

  // Wakes every current waiter.
  void NotifyAll() {
    for (auto& t : waiters_) t->cancel();
  }

 private:
  boost::asio::any_io_executor ex_;
  std::list<std::shared_ptr<boost::asio::steady_timer>> waiters_;
};

}  // namespace shoal::agent
