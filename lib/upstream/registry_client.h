#pragma once
// The client for upstream registries (OCI distribution pull API): token and Basic auth,
// redirects to CDNs, retries with backoff, and blob bodies streamed by Range.

#include <utility>  // must precede Boost.Asio with GCC 12 + Boost 1.74

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "lib/core/digest.h"
#include "lib/core/error.h"
#include "lib/http/address_policy.h"
#include "lib/http/url.h"
#include "lib/upstream/credentials.h"

namespace shoal::upstream {

// An upstream registry: its name in image references and where its API is served.
struct RegistryEndpoint {
  std::string name;  // "docker.io", "gcr.io", "127.0.0.1:5000"; keys credentials and tokens
  http::Url base;    // e.g. https://registry-1.docker.io; only scheme, host and port are used
  // Where the client may connect for this registry: for every hop (base, redirect targets,
  // token realms). kGlobalOnly for an endpoint a client's request chose (UpstreamMap, "https").
  http::AddressPolicy addresses = http::AddressPolicy::kAny;
};

// Settings of a RegistryClient.
struct ClientOptions {
  std::string ca_file;   // extra PEM CA file trusted besides the system's; empty for none
  int max_attempts = 6;  // attempts per call, the first included
  std::chrono::milliseconds initial_backoff{200};
  std::chrono::milliseconds max_backoff{10000};  // also caps an upstream's Retry-After
  std::chrono::seconds connect_timeout{10};
  std::chrono::seconds idle_timeout{30};  // longest stall of a single read or write
  std::string user_agent = "shoal/0.1";
};

// A manifest as served by the upstream.
struct ManifestResponse {
  std::string body;        // empty for HeadManifest
  std::string media_type;  // Content-Type without parameters, lowercased
  Digest digest;           // sha256 of body (GetManifest) or Docker-Content-Digest (HeadManifest)
};

// A listing (tags/list, referrers/<digest>) as the upstream served it.
struct ListingResponse {
  unsigned status = 200;        // 200, or 404
  std::string body;             // 200: the JSON body; 404: empty
  std::string content_type;     // as sent (200)
  std::string link;             // the Link header as sent, "" if none
  std::string filters_applied;  // OCI-Filters-Applied as sent, "" if none
  std::string error_code;       // 404: the first OCI error code of the body, "" if none
};

// What an access check (RegistryClient::CheckPull) asks the upstream for.
struct PullProbe {
  enum class Kind { kManifest, kBlob, kTags };
  Kind kind = Kind::kManifest;
  std::string reference;  // a tag or digest (kManifest), a digest (kBlob); unused for kTags
};

// The upstream's verdict on an access check: 200, 401/403 (or a refused token), 404.
enum class Access { kGranted, kRefused, kMissing };

// Receives blob bytes in order. An error aborts the fetch and is returned by FetchBlob as is.
using BodySink = std::function<Status(const char* data, size_t size)>;

// Talks to any number of upstream registries. Thread-safe: calls may run concurrently from many
// coroutines on an io_context run by one or more threads. The client, and the arguments passed by
// reference, must outlive each call (awaitables are lazy: co_await them in the same expression).
// Tokens are cached per (registry, scope) until shortly before they expire, and concurrent calls
// needing the same token share one token request. Authorization is never sent to a host other
// than the registry's (redirect targets such as signed CDN URLs get none).
//
// Transient failures (connect errors, timeouts, 5xx, 408, 429 honouring Retry-After, bodies cut
// short) are retried with exponential backoff and jitter up to max_attempts; other 4xx are not.
// Errors: kNotFound (404), kUnauthorized (401 after auth), kDenied (403), kTooManyRequests and
// kUnavailable (after the last attempt; retry_after_s set when the upstream gave one),
// kRangeNotSatisfiable (416), kDigestMismatch, kProtocol (unacceptable answers),
// kInvalidArgument (bad repository or reference). Messages name the URL (query stripped) and
// the repository/reference or digest; they never carry credentials or tokens.
class RegistryClient {
 public:
  // Traffic counters, for metrics.
  struct Stats {
    uint64_t requests = 0;  // HTTP requests sent (every hop and token request included)
    uint64_t retries = 0;   // attempts after the first
    uint64_t bytes = 0;     // blob bytes delivered to sinks
  };

  RegistryClient(boost::asio::any_io_executor executor, ClientOptions options,
                 Credentials credentials);
  ~RegistryClient();

  // GET /v2/<repo>/manifests/<reference> with the given Accept header. The body is capped at
  // 4 MiB (kProtocol beyond). The digest is the sha256 of the body; it must equal `reference`
  // when that is a digest, and the Docker-Content-Digest header when present (kDigestMismatch).
  boost::asio::awaitable<Result<ManifestResponse>> GetManifest(const RegistryEndpoint& registry,
                                                               const std::string& repo,
                                                               const std::string& reference,
                                                               const std::string& accept);

  // HEAD of the same URL: a cheap tag check. The body stays empty; the digest comes from
  // Docker-Content-Digest (or `reference` when it is a digest); kProtocol when neither exists.
  boost::asio::awaitable<Result<ManifestResponse>> HeadManifest(const RegistryEndpoint& registry,
                                                                const std::string& repo,
                                                                const std::string& reference,
                                                                const std::string& accept);

  // HEAD /v2/<repo>/blobs/<digest>, following redirects; returns the blob's size
  // (Content-Length; kProtocol when absent).
  boost::asio::awaitable<Result<uint64_t>> StatBlob(const RegistryEndpoint& registry,
                                                    const std::string& repo, const Digest& digest);

  // Delivers exactly bytes [offset, offset+length) of the blob to `sink`, in order, using
  // GET with a Range header. A 200 answer is accepted only when offset is 0 and the body is
  // `length` bytes long. Retries resume after the bytes already delivered. length 0 returns Ok
  // without a request. The sink is called from the coroutine running this call.
  boost::asio::awaitable<Status> FetchBlob(const RegistryEndpoint& registry,
                                           const std::string& repo, const Digest& digest,
                                           uint64_t offset, uint64_t length, BodySink sink);

  // GET /v2/<repo>/<endpoint>?<query> for endpoint "tags/list" or "referrers/<digest>", query
  // already percent-encoded ("" for none). The body is capped at 4 MiB (kProtocol beyond). A 404
  // is an answer here, not an error (a registry without the referrers API sends it): status 404
  // with the upstream's OCI code. Errors: as GetManifest; kInvalidArgument for a repository,
  // endpoint or query that cannot go into a request target.
  boost::asio::awaitable<Result<ListingResponse>> GetListing(const RegistryEndpoint& registry,
                                                             const std::string& repo,
                                                             const std::string& endpoint,
                                                             const std::string& query,
                                                             const std::string& accept);

  // Whether `auth` (nothing: anonymous) may pull `probe` of repo: HEAD manifests/<reference> or
  // blobs/<digest>, or GET tags/list?n=1, with those credentials only (Basic, or a token
  // fetched with them). The client's own credentials and cached tokens are never used, and no
  // token obtained here is cached. Errors: transient failures after the retries (kUnavailable,
  // kTooManyRequests), kProtocol, kInvalidArgument (bad repository or reference).
  boost::asio::awaitable<Result<Access>> CheckPull(const RegistryEndpoint& registry,
                                                   const std::string& repo,
                                                   const PullProbe& probe,
                                                   const std::optional<BasicAuth>& auth);

  // A snapshot of the counters.
  Stats stats() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace shoal::upstream
