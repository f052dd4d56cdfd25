#pragma once
// The tracker's blob API: chunk tables, upstream leases and chunk publication as JSON over HTTP,
// under /v1/blobs (routes in docs/architecture.md). Validates requests (400 with a precise
// message, never 500 for bad input), calls the BlobTable, and renders JSON answers that all
// carry this tracker's random tracker_id, so agents notice a restarted tracker. Lease requests
// with wait_ms > 0 long-poll on LeaseWaiters without blocking the thread.

#include <utility>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include <prometheus/registry.h>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/beast/http/verb.hpp>
#include <nlohmann/json_fwd.hpp>

#include "tracker/blobs/blob_table.h"
#include "tracker/lease_waiters.h"
#include "tracker/metrics.h"
#include "tracker/rate_limit.h"

namespace shoal::tracker {

struct BlobApiOptions {
  BlobTableOptions table;
  std::chrono::milliseconds max_wait{10'000};  // wait_ms is capped to this
  size_t max_waiters = 10'000;                 // beyond, lease requests are answered at once
  double bad_reports_per_minute = 6;           // per source address (a burst of as many)
};

// One request as the server read it. The views must stay valid until Handle completes.
struct BlobRequest {
  boost::beast::http::verb method = boost::beast::http::verb::get;
  std::string_view path;   // without the query
  std::string_view query;  // after '?', still percent-encoded
  std::string_view body;
  boost::asio::ip::address remote;  // the TCP peer (rate limits key on it: it cannot be forged)
};

struct BlobResponse {
  unsigned status = 200;
  std::string body;        // a JSON object
  std::string_view allow;  // for 405: the methods the path takes
  std::string_view route;  // metrics label: create_blob, get_blob, lease, renew, publish, ...
};

// A validated request (defined in blob_api.cc).
struct BlobCall;

// Not thread-safe: runs on the server's single io_context thread.
class BlobApi {
 public:
  // Registers its metrics on registry, which must outlive the API. seed feeds lease ids.
  BlobApi(BlobApiOptions options, prometheus::Registry& registry, std::string tracker_id,
          uint64_t seed = std::random_device{}());

  // Whether the server routes path here (/v1/blobs and everything below it).
  static bool Owns(std::string_view path);
  // A fresh random tracker id: 16 lowercase hex characters.
  static std::string NewTrackerId();

  // Answers req. A lease request with wait_ms > 0 that would be told to wait is held until the
  // chunk becomes ready, a lease becomes obtainable for the agent, or wait_ms (capped) passes;
  // a ready request (one long-poll for a window of chunks) until any of its chunks is ready.
  boost::asio::awaitable<BlobResponse> Handle(BlobRequest req);
  // Answers req as of now without waiting (wait_ms is ignored).
  BlobResponse HandleNow(const BlobRequest& req, TimePoint now);
  // A JSON error answer {"error": message, "tracker_id": ...} (for errors the server detects,
  // such as an oversized body on a blob route).
  BlobResponse Error(unsigned status, std::string message, std::string_view route = "other") const;
  // Makes every parked long-poll answer now and later ones answer at once (shutdown).
  void Shutdown();
  // Expires leases past their expiry and refreshes the gauges (upkeep, and before /metrics).
  void Sweep(TimePoint now);
  // Plain-text lines for the status page: totals, settings, active leases with progress.
  std::string StatusSection(TimePoint now) const;

  const std::string& tracker_id() const { return tracker_id_; }
  const BlobTable& table() const { return table_; }
  // See BlobTable::SetSeedersLostProbe.
  void SetSeedersLostProbe(SeedersLostProbe probe) { table_.SetSeedersLostProbe(std::move(probe)); }
  size_t waiters() const { return waiters_.size(); }

 private:
  BlobResponse Execute(const BlobCall& call, TimePoint now);
  BlobResponse LeaseResponse(const BlobResult<LeaseAnswer>& answer, std::string_view route) const;
  // The ready answers among call.chunks (lease requests without grant); lowers recheck_at to the
  // earliest time a waiting chunk's answer could change by itself.
  BlobResult<std::vector<LeaseAnswer>> ReadyAmong(const BlobCall& call, TimePoint now,
                                                  TimePoint& recheck_at);
  BlobResponse ReadyResponse(const BlobCall& call,
                             const BlobResult<std::vector<LeaseAnswer>>& result);
  BlobResponse Json(unsigned status, std::string_view route, nlohmann::json body) const;
  BlobResponse Failure(const BlobError& error, std::string_view route) const;
  void OnEvent(BlobEvent event, const Digest& digest);
  void Finish(const BlobResponse& response);

  BlobApiOptions options_;
  std::string tracker_id_;
  BlobTable table_;
  BlobMetrics metrics_;
  LeaseWaiters waiters_;
  RateLimit bad_reports_;
  bool stopping_ = false;
};

}  // namespace shoal::tracker
