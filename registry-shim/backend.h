#pragma once
// What the registry shim needs from the node: manifests and readable blobs. The agent implements
// it (cache, upstream, and later the swarm); the shim only speaks HTTP.

#include <utility>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "lib/core/digest.h"
#include "lib/core/error.h"

namespace shoal::shim {

// A repository on a given upstream registry, e.g. {"gcr.io", "proj/img"}.
struct RepoRef {
  std::string registry;
  std::string repository;
  std::string str() const { return registry + "/" + repository; }
};

// A manifest ready to serve: its exact bytes, media type and digest.
struct ManifestResult {
  std::string body;
  std::string media_type;
  Digest digest;
};

// An upstream listing passed through (tags/list, referrers/<digest>): not cached.
struct ListingResult {
  unsigned status = 200;        // 200, or 404 (the upstream does not have it, or no such API)
  std::string body;             // the upstream's JSON body (200 only)
  std::string content_type;     // the upstream's Content-Type (200 only)
  std::string link;             // the upstream's Link header as sent, "" if none
  std::string filters_applied;  // OCI-Filters-Applied (referrers), "" if none
  std::string error_code;       // for a 404: the upstream's OCI error code, "" if it sent none
};

// A blob being served, complete in the cache or still arriving. Readers only see bytes that are
// safe to send: an in-flight blob withholds its last byte until the whole blob has been hashed
// and matched its digest, so a client never receives a complete body with wrong content.
// Used from the agent's network thread only.
class BlobReader {
 public:
  virtual ~BlobReader() = default;
  // Total size in bytes (known before any byte is served).
  virtual uint64_t size() const = 0;
  // A file descriptor holding the blob's bytes at their offsets; valid while the reader lives.
  virtual int fd() const = 0;
  // Waits until bytes past offset are safe to send and returns end, with bytes [0, end) safe and
  // end > offset (or end == size() once complete). Errors: the fetch failed (kDigestMismatch,
  // kUnavailable, kIo, ...); the caller must then abort the response.
  virtual boost::asio::awaitable<Result<uint64_t>> WaitReadable(uint64_t offset) = 0;
  // Waits until the whole blob is known to match its digest. A reader that serves a Range
  // ending before the blob's last byte calls it before that range's last byte. Default: nothing
  // to wait for (an in-flight blob is checked piece by piece and as a whole before its end).
  virtual boost::asio::awaitable<Status> WaitVerified() { co_return Ok(); }
  // Where the bytes come from, for metrics: "cache" or "upstream".
  virtual std::string_view source() const = 0;
};

// What a pull request asks for, for Backend::AuthorizePull.
struct PullTarget {
  enum class Kind { kManifest, kBlob, kListing };
  Kind kind = Kind::kManifest;
  std::string reference;  // the tag or digest (kManifest), the digest (kBlob); "" for kListing
};

// Why a request is not served to this client: the error (its code gives the status), the OCI
// code to answer with, and whether to challenge (401 with WWW-Authenticate: Basic).
struct PullRefusal {
  Error error;
  std::string oci_code;
  bool challenge = false;
};

// The challenge the shim sends when it needs a client's own credentials.
inline constexpr std::string_view kPullAuthChallenge = "Basic realm=\"shoal\"";

// Implemented by the agent. Called on the network thread.
class Backend {
 public:
  virtual ~Backend() = default;
  // Whether this node serves the repository's registry at all (e.g. it is in the upstream map).
  // Called before GetManifest/OpenBlob; errors are answered as NAME_UNKNOWN (kRefused: see
  // MakeErrorReply).
  virtual Status CheckRegistry(const RepoRef& repo) const {
    (void)repo;
    return Ok();
  }
  // Whether this client may be served `target` of repo. authorization is the request's
  // Authorization header ("" when none); it is neither logged nor kept. Called after
  // CheckRegistry and before GetManifest/OpenBlob/GetListing. nullopt: serve. Default: serve all.
  virtual boost::asio::awaitable<std::optional<PullRefusal>> AuthorizePull(
      const RepoRef& repo, const PullTarget& target, std::string_view authorization) {
    (void)repo, (void)target, (void)authorization;
    co_return std::nullopt;
  }
  // Resolves a tag or digest to a manifest. accept is the client's list of media types (empty
  // means any). Errors: kNotFound, kInvalidArgument, kUnavailable, kUnauthorized, ...
  virtual boost::asio::awaitable<Result<ManifestResult>> GetManifest(
      const RepoRef& repo, const std::string& reference,
      const std::vector<std::string>& accept) = 0;
  // Opens a blob for reading, starting a fetch if it is not cached. Errors: kNotFound when the
  // upstream does not have it, kUnavailable, kIo.
  virtual boost::asio::awaitable<Result<std::shared_ptr<BlobReader>>> OpenBlob(
      const RepoRef& repo, const Digest& digest) = 0;
  // Passes GET /v2/<repository>/<endpoint>?<query> to the upstream: endpoint is "tags/list" or
  // "referrers/<digest>", query the parameters to forward (already checked, may be empty).
  // Errors: as GetManifest (an upstream 404 is a result, not an error).
  virtual boost::asio::awaitable<Result<ListingResult>> GetListing(const RepoRef& repo,
                                                                   const std::string& endpoint,
                                                                   const std::string& query) {
    (void)repo, (void)endpoint, (void)query;
    co_return MakeError(ErrorCode::kUnsupported, "this backend serves no listings");
  }
};

}  // namespace shoal::shim
