#pragma once
// The tracker's manifest API: the cluster-wide manifest cache (tracker/manifests/manifest_cache.h) as JSON
// over HTTP under /v1/manifests. Agents ask here before going upstream; the tracker never
// fetches upstream itself (it holds no registry credentials):
//   POST /v1/manifests/resolve?wait_ms=N  {"agent","registry","repository","reference"}
//        -> {"state":"found","digest","media_type","manifest":base64,"age_ms"}
//         | {"state":"fetch","lease_ttl_ms"}  (you fetch upstream, then PUT)
//         | {"state":"wait","retry_after_ms"} (someone else fetches; long-polls up to wait_ms)
//         | {"state":"missing","error","age_ms"} (an agent's upstream fetch found nothing
//           less than --manifest-missing-ttl-s ago; answer "not found" without going upstream)
//   PUT  /v1/manifests/{digest}  {"agent","registry","repository","reference","media_type",
//                                 "manifest":base64}  (verified: sha256 of the bytes = digest)
//   POST /v1/manifests/release   {"agent","registry","repository","reference"[,"missing"]}
//        (fetch failed; "missing": the upstream's 404 text, remembered for the cluster)
//   GET  /v1/manifests/{digest}  -> {"digest","media_type","manifest"}
// Every answer carries the tracker's tracker_id, like the blob API.

#include <utility>

#include <chrono>
#include <cstddef>
#include <random>
#include <string>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <boost/asio/awaitable.hpp>
#include <nlohmann/json_fwd.hpp>

#include "tracker/blobs/blob_api.h"
#include "tracker/lease_waiters.h"
#include "tracker/manifests/manifest_cache.h"

namespace shoal::tracker {

struct ManifestApiOptions {
  ManifestCacheOptions cache;
  std::chrono::milliseconds max_wait{10'000};  // wait_ms is capped to this
  size_t max_waiters = 10'000;                 // beyond, resolve requests are answered at once
};

// Not thread-safe: runs on the server's single io_context thread. Answers reuse BlobRequest and
// BlobResponse (same shape: method, path, query, body -> status, JSON body).
class ManifestApi {
 public:
  // Registers its metrics on registry, which must outlive the API.
  // seed feeds the fetch lease ids (tests and fuzzers pass a fixed one).
  ManifestApi(ManifestApiOptions options, prometheus::Registry& registry, std::string tracker_id,
              uint64_t seed = std::random_device{}());

  // Whether the server routes path here (/v1/manifests and everything below it).
  static bool Owns(std::string_view path);
  // Answers req; a resolve with wait_ms > 0 that would wait is held until the reference is
  // published or released, the lease expires, or wait_ms (capped) passes.
  boost::asio::awaitable<BlobResponse> Handle(BlobRequest req);
  // Answers req as of now without waiting.
  BlobResponse HandleNow(const BlobRequest& req, TimePoint now);
  // Makes every parked long-poll answer now and later ones answer at once (shutdown).
  void Shutdown();
  // Drops expired leases and tags; refreshes the gauges.
  void Sweep(TimePoint now);
  // Plain-text lines for the status page.
  std::string StatusSection() const;

  const ManifestCache& cache() const { return cache_; }

 private:
  struct Call;
  BlobResponse Execute(const Call& call, TimePoint now);
  // Renders (and counts) a resolve answer.
  BlobResponse ResolveResponse(const Call& call, const ManifestAnswer& answer, TimePoint now);
  BlobResponse Json(unsigned status, nlohmann::json body) const;
  BlobResponse Error(unsigned status, std::string message) const;
  void Count(const BlobResponse& response, std::string_view route);

  ManifestApiOptions options_;
  std::string tracker_id_;
  ManifestCache cache_;
  LeaseWaiters waiters_;
  bool stopping_ = false;
  prometheus::Family<prometheus::Counter>& requests_;  // shoal_tracker_manifest_api_requests_total
  prometheus::Counter& hits_;                          // shoal_tracker_manifest_hits_total
  prometheus::Counter& misses_;           // shoal_tracker_manifest_misses_total (lease granted)
  prometheus::Counter& lease_waits_;      // shoal_tracker_manifest_lease_waits_total
  prometheus::Counter& missing_hits_;     // shoal_tracker_manifest_missing_hits_total
  prometheus::Counter& missing_reports_;  // shoal_tracker_manifest_missing_reports_total
  prometheus::Counter& leases_expired_;   // shoal_tracker_manifest_leases_expired_total
  prometheus::Counter& published_;        // shoal_tracker_manifests_published_total
  prometheus::Counter& rejected_;         // shoal_tracker_manifest_publish_rejected_total
  prometheus::Counter& not_holder_;       // shoal_tracker_manifest_publishes_refused_total
  prometheus::Gauge& manifests_;          // shoal_tracker_manifests
  prometheus::Gauge& bytes_;              // shoal_tracker_manifest_bytes
};

}  // namespace shoal::tracker
