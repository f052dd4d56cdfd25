#pragma once
// Runs blocking work (fsync, hashing) on a thread pool from a coroutine on the network thread.

#include <optional>
#include <type_traits>
#include <utility>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace shoal::agent {

// co_await OnPool(pool, f): f() runs on `pool`; the coroutine resumes on its own executor with
// f's result. f must not touch network-thread state. Capture by reference (the caller's frame
// outlives the call): a lambda holding an http::Url by value, passed as a temporary inside the
// co_await, aborted the agent with "free(): invalid pointer" (session 34). GCC 12 can destroy a
// co_await expression's temporaries twice, as tracker/router.cc notes.
template <class F>
auto OnPool(boost::asio::thread_pool& pool, F f)
    -> boost::asio::awaitable<std::invoke_result_t<F&>> {
  using R = std::invoke_result_t<F&>;
  // std::optional: the completion value need not be default-constructible.
  auto initiate = [&pool](auto handler, F work) {
    auto guard = boost::asio::make_work_guard(boost::asio::get_associated_executor(handler));
    boost::asio::post(pool, [handler = std::move(handler), work = std::move(work),
                             guard = std::move(guard)]() mutable {
      std::optional<R> result(work());
      auto ex = guard.get_executor();
      boost::asio::post(ex, [handler = std::move(handler), result = std::move(result)]() mutable {
        std::move(handler)(std::move(result));
      });
    });
  };
  std::optional<R> r = co_await boost::asio::async_initiate<
      decltype(boost::asio::use_awaitable), void(std::optional<R>)>(initiate,
                                                                    boost::asio::use_awaitable,
                                                                    std::move(f));
  co_return std::move(*r);
}

}  // namespace shoal::agent
