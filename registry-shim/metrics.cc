#include "registry-shim/metrics.h"

#include <string>

namespace shoal::shim {

Metrics Metrics::Create(prometheus::Registry& registry) {
  auto& requests = prometheus::BuildCounter()
                       .Name("shoal_shim_requests_total")
                       .Help("Requests answered by the registry shim, by route and HTTP status")
                       .Register(registry);
  auto& bytes = prometheus::BuildCounter()
                    .Name("shoal_shim_blob_bytes_total")
                    .Help("Blob body bytes sent to clients, by where the blob came from")
                    .Register(registry);
  auto& aborted = prometheus::BuildCounter()
                      .Name("shoal_shim_aborted_responses_total")
                      .Help(
                          "Blob responses cut short, by reason: client_gone (the client closed "
                          "or stopped reading), fetch_failed (the blob could not be completed "
                          "or verified), file_error")
                      .Register(registry);
  for (const char* reason : {"client_gone", "fetch_failed", "file_error"})
    aborted.Add({{"reason", reason}});
  auto& connects = prometheus::BuildCounter()
                       .Name("shoal_proxy_connects_total")
                       .Help(
                           "CONNECT requests to the HTTPS proxy mode, by what was done: "
                           "terminate (served as a registry), tunnel, denied")
                       .Register(registry);
  for (const char* mode : {"terminate", "tunnel", "denied"}) connects.Add({{"mode", mode}});
  auto& handshakes = prometheus::BuildCounter()
                         .Name("shoal_proxy_tls_handshake_failures_total")
                         .Help("Terminated CONNECTs whose TLS handshake failed")
                         .Register(registry);
  auto& refused = prometheus::BuildCounter()
                      .Name("shoal_shim_refused_registries_total")
                      .Help(
                          "Requests refused because their registry is not served: not in the "
                          "upstream map and, under --unmapped https, not at a global address "
                          "(the log says which)")
                      .Register(registry);
  auto& first_byte = prometheus::BuildHistogram()
                         .Name("shoal_shim_blob_first_byte_seconds")
                         .Help(
                             "Time from a blob request to its first body byte, by where the "
                             "blob came from (cache, or upstream: a fetch in flight)")
                         .Register(registry);
  auto& complete = prometheus::BuildHistogram()
                       .Name("shoal_shim_blob_complete_seconds")
                       .Help(
                           "Time from a blob request to its last body byte, by where the blob "
                           "came from (cache, or upstream: a fetch in flight)")
                       .Register(registry);
  return Metrics{requests,
                 bytes.Add({{"source", "cache"}}),
                 bytes.Add({{"source", "upstream"}}),
                 aborted,
                 connects,
                 handshakes.Add({}),
                 refused.Add({}),
                 first_byte,
                 complete};
}

void Metrics::CountAborted(std::string_view reason) {
  aborted_responses.Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::CountRequest(std::string_view route, unsigned status) {
  requests.Add({{"route", std::string(route)}, {"code", std::to_string(status)}}).Increment();
}

void Metrics::CountConnect(std::string_view mode) {
  proxy_connects.Add({{"mode", std::string(mode)}}).Increment();
}

void Metrics::CountBlobBytes(std::string_view source, uint64_t bytes) {
  (source == "cache" ? blob_bytes_cache : blob_bytes_upstream)
      .Increment(static_cast<double>(bytes));
}

}  // namespace shoal::shim

namespace shoal::shim {

void Metrics::ObserveBlobTime(std::string_view stage, std::string_view source,
                              std::chrono::steady_clock::duration elapsed) {
  // 10 ms to an hour: a cached layer's first byte to a 17 GB layer through a cold swarm.
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600};
  auto& family = stage == "first_byte" ? blob_first_byte : blob_complete;
  family.Add({{"source", source == "cache" ? "cache" : "upstream"}}, kBuckets)
      .Observe(std::chrono::duration<double>(elapsed).count());
}

}  // namespace shoal::shim
