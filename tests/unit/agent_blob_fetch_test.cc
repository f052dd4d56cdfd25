// BlobFetch: a blob assembled in the cache while readers stream its contiguous prefix.

#include <doctest/doctest.h>

#include <unistd.h>

#include <utility>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "agent/blob_fetch.h"
#include "lib/core/sha256.h"
#include "lib/store/blob_store.h"

namespace shoal::agent {
namespace {
namespace asio = boost::asio;
namespace fs = std::filesystem;

struct TempRoot {
  std::string path;
  TempRoot() {
    char tmpl[] = "/tmp/shoal-blob-fetch-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempRoot() { fs::remove_all(path); }
};

// Runs ioc until done() or 10 s pass.
template <typename Done>
void RunUntil(asio::io_context& ioc, Done done) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    ioc.restart();
    ioc.run_for(std::chrono::milliseconds(10));
  }
}
}  // namespace

TEST_CASE("blob fetch: a waiting reader wakes at the first bytes, not after a whole step") {
  TempRoot root;
  auto store = store::BlobStore::Open(root.path);
  REQUIRE(store.has_value());
  asio::io_context ioc;
  asio::thread_pool pool(1);
  // 3 MiB: larger than the 1 MiB step in which later readers are woken.
  std::string data(3u << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + (i >> 12));
  const Digest digest = Sha256::Of(data);
  std::optional<bool> ended;
  auto fetch =
      std::make_shared<BlobFetch>(ioc, pool, *store.value(), digest, [&](bool ok) { ended = ok; });
  REQUIRE(fetch->Open(data.size()).has_value());

  std::optional<Result<uint64_t>> first;
  asio::co_spawn(
      ioc, [&]() -> asio::awaitable<void> { first = co_await fetch->WaitReadable(0); },
      asio::detached);
  ioc.run_for(std::chrono::milliseconds(50));  // the reader parks: nothing is filled yet
  CHECK_FALSE(first.has_value());

  // 16 KiB arrive at offset 0: the reader may send them now.
  REQUIRE(fetch->Write(data.data(), 16 << 10, 0).has_value());
  RunUntil(ioc, [&] { return first.has_value(); });
  REQUIRE(first.has_value());
  REQUIRE(first->has_value());
  CHECK(first->value() == (16u << 10));

  // The rest, out of order: the last byte is released only once the digest matched.
  REQUIRE(fetch->Write(data.data() + (2u << 20), data.size() - (2u << 20), 2u << 20).has_value());
  REQUIRE(fetch->Write(data.data() + (16 << 10), (2u << 20) - (16 << 10), 16 << 10).has_value());
  std::optional<Result<uint64_t>> all;
  asio::co_spawn(
      ioc, [&]() -> asio::awaitable<void> { all = co_await fetch->WaitReadable(data.size() - 1); },
      asio::detached);
  RunUntil(ioc, [&] { return all.has_value() && ended.has_value(); });
  REQUIRE(all.has_value());
  REQUIRE(all->has_value());
  CHECK(all->value() == data.size());
  REQUIRE(ended.has_value());
  CHECK(*ended);
  CHECK(store.value()->Stat(digest).has_value());
  pool.join();
}

}  // namespace shoal::agent
