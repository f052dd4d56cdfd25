#pragma once
// co_await SleepFor(d): resumes the coroutine after d on its own executor (a cancelled timer
// resumes it early, without an error).

#include <chrono>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace shoal::agent {

inline boost::asio::awaitable<void> SleepFor(std::chrono::milliseconds d) {
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  timer.expires_after(d);
  boost::system::error_code ec;
  co_await timer.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
}

}  // namespace shoal::agent
