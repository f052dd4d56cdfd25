#pragma once
// Prometheus counters of the registry shim, registered on the agent's registry.

#include <chrono>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace shoal::shim {

// References into a prometheus::Registry that outlives this struct. Thread-safe (atomics).
struct Metrics {
  prometheus::Family<prometheus::Counter>& requests;  // shoal_shim_requests_total{route,code}
  prometheus::Counter& blob_bytes_cache;              // shoal_shim_blob_bytes_total{source=cache}
  prometheus::Counter& blob_bytes_upstream;           // ...{source=upstream}
  // shoal_shim_aborted_responses_total{reason}: client_gone, fetch_failed, file_error.
  prometheus::Family<prometheus::Counter>& aborted_responses;
  prometheus::Family<prometheus::Counter>& proxy_connects;  // shoal_proxy_connects_total{mode}
  prometheus::Counter& proxy_handshake_failures;  // shoal_proxy_tls_handshake_failures_total
  // shoal_shim_refused_registries_total: answers for registries not served (kRefused). No
  // reason label: /metrics is open to the shim's clients, and the reason is what must not show.
  prometheus::Counter& refused_registries;
  // shoal_shim_blob_first_byte_seconds{source} and shoal_shim_blob_complete_seconds{source}:
  // from a blob request to its first body byte and to its last, by where the blob came from
  // (cache, or upstream: a fetch in flight, from peers or the registry).
  prometheus::Family<prometheus::Histogram>& blob_first_byte;
  prometheus::Family<prometheus::Histogram>& blob_complete;

  // Registers the families on registry.
  static Metrics Create(prometheus::Registry& registry);
  // Counts one answered request.
  void CountRequest(std::string_view route, unsigned status);
  // Counts body bytes sent for a blob read from source ("cache" or "upstream").
  void CountBlobBytes(std::string_view source, uint64_t bytes);
  // Records a blob response's time to its first body byte (stage "first_byte") or to its last
  // ("complete"), by source ("cache" or "upstream").
  void ObserveBlobTime(std::string_view stage, std::string_view source,
                       std::chrono::steady_clock::duration elapsed);
  // Counts one blob response cut short, by reason (see aborted_responses).
  void CountAborted(std::string_view reason);
  // Counts one CONNECT by what the proxy did: "terminate", "tunnel" or "denied".
  void CountConnect(std::string_view mode);
};

}  // namespace shoal::shim
