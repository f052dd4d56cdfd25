#pragma once
// One timed GET of a whole blob from a server on 127.0.0.1, for the benchmarks: a plain
// non-blocking socket, Beast parses the response header, the body is read into a 1 MiB buffer
// and discarded, so the client costs as little as it can.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace shoal::testkit {

struct BlobGet {
  uint64_t bytes = 0;      // body bytes received
  double seconds = 0;      // request sent .. last body byte
  double ttfb_s = 0;       // request sent .. first body byte
  double last_byte_s = 0;  // last-but-one body byte .. last body byte
  std::string error;       // empty on success
};

struct BlobGetOptions {
  std::chrono::seconds timeout{900};     // the whole response at most
  std::chrono::seconds stall{60};        // no progress for this long fails it
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by a signal handler): give up
  std::string user_agent = "shoal-bench";
};

// GET http://127.0.0.1:port<target>. Fails (error set) on anything but a 200 with a
// Content-Length of expect_size (any length if 0) and that many body bytes.
BlobGet GetBlob(uint16_t port, const std::string& target, uint64_t expect_size,
                const BlobGetOptions& options = {});

}  // namespace shoal::testkit
