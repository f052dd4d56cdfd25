#pragma once
// shoalctl's view of a node's agent: its registry shim (OCI pull API) and its /metrics.

#include <utility>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "lib/core/error.h"
#include "lib/http/client.h"
#include "lib/oci/manifest.h"
#include "lib/oci/reference.h"

namespace shoal::ctl {

// One image pulled through an agent: what was resolved and how many bytes came back.
struct PullReport {
  Digest manifest_digest = Digest::FromSha256Hex(std::string(64, '0'));
  std::string media_type;
  int blobs = 0;
  uint64_t bytes = 0;
};

// An image reference resolved to one platform's manifest.
struct ResolvedImage {
  Digest digest = Digest::FromSha256Hex(std::string(64, '0'));  // of the top manifest (or index)
  std::string media_type;                                       // of the top manifest
  oci::Manifest manifest;  // the platform's image manifest (the top one unless it is an index)
};

// Progress callback: (blob digest, bytes of this blob so far, blob size).
using ProgressFn = std::function<void(const Digest&, uint64_t, uint64_t)>;
// Receives a blob's bytes piece by piece, in order; an error stops the stream.
using BlobSink = std::function<Status(std::string_view piece)>;

// The error for a shim answer with HTTP status (404 kNotFound, 401, 403, 429, 5xx
// kUnavailable, else kInvalidArgument), naming `what` and the start of the body.
Error HttpFailure(unsigned status, const std::string& what, const std::string& body);

// Talks to one agent over HTTP. Single-threaded: use from coroutines on one io_context.
class AgentClient {
 public:
  AgentClient(boost::asio::io_context& ioc, http::Url agent);

  // Pulls image through the agent's shim, as a runtime would: resolves the manifest (choosing
  // `platform` "os/arch" from an index), then reads every blob to the end, which leaves it
  // verified in the node's cache. Errors: the shim's error (kNotFound, kUnavailable...), or
  // kDigestMismatch if a blob's bytes do not hash to its digest.
  boost::asio::awaitable<Result<PullReport>> Pull(const oci::ImageRef& image,
                                                  const std::string& platform,
                                                  const ProgressFn& progress);
  // The agent's /metrics text.
  boost::asio::awaitable<Result<std::string>> Metrics();
  // GETs the manifest `reference` (tag or digest) of image through the shim; returns its bytes
  // and Content-Type (unverified). Errors: HttpFailure for a non-200 answer, transport errors.
  boost::asio::awaitable<Result<std::pair<std::string, std::string>>> GetManifest(
      const oci::ImageRef& image, const std::string& reference);
  // Resolves image to the manifest of `platform` ("os/arch") through the shim: the top manifest,
  // and for an index the child for that platform. Errors: GetManifest's, manifest parse errors,
  // kNotFound when an index has no such platform.
  boost::asio::awaitable<Result<ResolvedImage>> Resolve(const oci::ImageRef& image,
                                                        const std::string& platform);
  // GETs blob through the shim into sink and returns its size. Errors: HttpFailure for a
  // non-200 answer, transport errors, the sink's error, kProtocol when the size differs from
  // blob.size, kDigestMismatch when verify_digest and the bytes do not hash to blob.digest
  // (callers that hash the bytes themselves, like the extractor, pass false).
  boost::asio::awaitable<Result<uint64_t>> StreamBlob(const oci::ImageRef& image,
                                                      const oci::Descriptor& blob,
                                                      const BlobSink& sink,
                                                      bool verify_digest = true);

 private:
  boost::asio::awaitable<Result<std::unique_ptr<http::Response>>> Get(const std::string& target,
                                                                      const std::string& accept);

  http::Url agent_;
  http::Client client_;
};

}  // namespace shoal::ctl
