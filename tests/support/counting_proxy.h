#pragma once
// An HTTP/1.1 reverse proxy to one upstream (typically docker-registry) that counts what the
// upstream served, and can inject failures and throttle. Tests put it between the agent and the
// registry to measure upstream traffic.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "lib/core/digest.h"
#include "lib/core/error.h"
#include "tests/support/sync_server.h"

namespace shoal::testkit {

// Listens on 127.0.0.1 (a port of its own), forwards every request to the upstream over one
// upstream connection per client connection, streaming bodies both ways (no whole-blob
// buffering) and passing all headers through unchanged (Host included, so Location headers the
// registry builds point back at the proxy). All methods are thread-safe.
class CountingProxy {
 public:
  // upstream_host_port: "127.0.0.1:PORT". Errors: kUnavailable if it cannot listen.
  static Result<std::unique_ptr<CountingProxy>> Start(std::string upstream_host_port);
  ~CountingProxy();  // Stop()s
  CountingProxy(const CountingProxy&) = delete;
  CountingProxy& operator=(const CountingProxy&) = delete;

  // "127.0.0.1:PORT" and "http://127.0.0.1:PORT" of the proxy itself.
  std::string HostPort() const;
  std::string Url() const;

  // Response body bytes relayed for GET .../blobs/<digest> answered 2xx by the upstream.
  uint64_t BlobBytes() const;
  // Number of GET requests for that blob (any status, failures injected included).
  uint64_t BlobGets(const Digest& digest) const;
  // Number of GET and HEAD requests on .../manifests/... (any status).
  uint64_t ManifestGets() const;
  // Number of requests received (any path, method, status).
  uint64_t Requests() const;
  // "METHOD target -> status" for every request so far, in arrival order.
  std::vector<std::string> RequestLog() const;
  // Zeroes all counters and the request log.
  void Reset();

  // Answers the next n requests with `status` and an OCI error body without contacting the
  // upstream. With status 429, also sends Retry-After: 1.
  void FailNext(int n, int status = 503);
  // Holds the next n blob GETs without an answer (nor a byte) until the client hangs up or the
  // proxy stops: an upstream that a node's connections reach but never hear from.
  void StallNextBlobGets(int n);
  // Sleeps this long per MiB of response body relayed (0 = no throttle).
  void SetDelayPerMiB(std::chrono::milliseconds delay);
  // Caps the response body bytes relayed per second over all connections together (a link of
  // that rate shared by every request, with a burst of at most 20 ms of it, 256 KiB at least;
  // 0 = no cap). Applies on top of SetDelayPerMiB.
  void SetRateLimit(uint64_t bytes_per_second);
  // Adds header `name: value` to every later upstream response to a request whose target
  // contains `target_part`: what a registry that paginates would send (docker-registry 2.8 sends
  // no Link on tags/list). `value` may hold "{upstream}", replaced by the upstream's host:port.
  void AddResponseHeader(std::string target_part, std::string name, std::string value);
  // Points later connections at another upstream (e.g. a restarted registry).
  void SetUpstream(std::string upstream_host_port);

  // Closes the listener and all connections and joins their threads. Idempotent.
  void Stop();

 private:
  CountingProxy();  // defined in the .cc, where SyncHttpServer is complete
  void Serve(boost::asio::ip::tcp::socket& client);
  // Classifies and counts a request; returns the status to inject, kStall to hold it, or 0 to
  // forward it.
  static constexpr int kStall = -1;
  int Count(const std::string& method, const std::string& target);
  void CountBlobBytes(uint64_t n);
  // With a rate limit: reserves n bytes of the shared link and returns when they may be sent.
  void Pace(uint64_t n);
  void Log(const std::string& method, const std::string& target, int status);

  std::unique_ptr<SyncHttpServer> server_;
  mutable std::mutex mu_;
  std::string upstream_;                        // GUARDED_BY(mu_)
  uint64_t blob_bytes_ = 0;                     // GUARDED_BY(mu_)
  uint64_t manifest_gets_ = 0;                  // GUARDED_BY(mu_)
  uint64_t requests_ = 0;                       // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> blob_gets_;   // GUARDED_BY(mu_), by digest string
  std::vector<std::string> log_;                // GUARDED_BY(mu_)
  int fail_next_ = 0;                           // GUARDED_BY(mu_)
  int fail_status_ = 503;                       // GUARDED_BY(mu_)
  int stall_next_ = 0;                          // GUARDED_BY(mu_)
  std::chrono::milliseconds delay_per_mib_{0};  // GUARDED_BY(mu_)
  uint64_t rate_limit_ = 0;                     // bytes per second; GUARDED_BY(mu_)
  // When the bytes reserved so far have all been sent at rate_limit_. GUARDED_BY(mu_).
  std::chrono::steady_clock::time_point link_free_{};
  struct ExtraHeader {
    std::string target_part, name, value;
  };
  std::vector<ExtraHeader> extra_headers_;  // GUARDED_BY(mu_)
  // Open upstream sockets, shut down by Stop() so that no handler stays blocked on a hung
  // upstream. GUARDED_BY(mu_).
  std::set<int> upstream_fds_;
  bool stopping_ = false;  // GUARDED_BY(mu_)
};

}  // namespace shoal::testkit
