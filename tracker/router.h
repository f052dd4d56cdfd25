#pragma once
// Which part of the tracker answers an HTTP request, and its answer: the access check, then
// BitTorrent (/announce, /scrape, and announces in batches: /v1/announces), /metrics, /healthz,
// the status page, the cluster view and page, and the blob, manifest and prefetch APIs. Every
// request is counted by route and status.

#include <utility>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "tracker/access.h"
#include "tracker/blobs/blob_api.h"
#include "tracker/manifests/manifest_api.h"
#include "tracker/prefetch/prefetch_api.h"
#include "tracker/swarms/service.h"

namespace shoal::tracker {

// Announce queries are ~300 bytes; nothing legitimate needs large headers.
inline constexpr uint32_t kRequestHeaderLimit = 8 * 1024;
// Blob API bodies are small JSON; a publish carries one chunk's metainfo (about 20 bytes per
// piece, base64-encoded).
inline constexpr uint64_t kRequestBodyLimit = 8u << 20;

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpResponse = boost::beast::http::response<boost::beast::http::string_body>;
using HttpRequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// Gives parser the tracker's header and body limits.
void LimitRequest(HttpRequestParser& parser);
// The request that `bytes` are, exactly and completely (within the limits); nullopt when they
// are less, more, or malformed.
std::optional<HttpRequest> ParseWholeRequest(std::string_view bytes);

// Builds a response with the tracker's Server, Content-Type and Cache-Control: no-store.
HttpResponse MakeHttpResponse(unsigned version, bool keep_alive, boost::beast::http::status status,
                              std::string body, std::string_view content_type);

// Lives on the server's io_context; all methods must be called on its (single) thread.
class Router {
 public:
  // service, blobs, manifests, prefetch and access must outlive the router.
  Router(TrackerService& service, BlobApi& blobs, ManifestApi& manifests, PrefetchApi& prefetch,
         Access& access)
      : service_(service),
        access_(access),
        blobs_(blobs),
        manifests_(manifests),
        prefetch_(prefetch) {}

  // Provides the /metrics body (Prometheus text format); called after the gauges are refreshed.
  void SetMetricsHandler(std::function<std::string()> handler) {
    metrics_text_ = std::move(handler);
  }
  // Provides the GET /v1/cluster body (JSON, tracker/cluster/cluster_view.h).
  void SetClusterViewHandler(std::function<std::string()> handler) {
    cluster_view_ = std::move(handler);
  }

  // The answer to req if it needs no waiting (every route but an admitted call of the blob,
  // manifest or prefetch API, whose long-polls wait), counted; nullopt otherwise.
  std::optional<HttpResponse> AnswerNow(const HttpRequest& req,
                                        const boost::asio::ip::address& remote);
  // The answer to any request, counted; waits only in the blob, manifest and prefetch APIs.
  boost::asio::awaitable<HttpResponse> Answer(const HttpRequest& req,
                                              boost::asio::ip::address remote);
  // The whole answer on the wire (status line, headers, body), counted, if `received` (the first
  // read of a connection) is exactly one complete request that closes the connection and needs
  // no waiting; nullopt when a session must read and answer it (more to come, keep-alive,
  // pipelined, Expect, malformed, or a blob, manifest or prefetch call).
  std::optional<std::string> AnswerFirstRead(std::string_view received,
                                             const boost::asio::ip::address& remote);
  // The answer to a request whose body is over the limit (413), counted.
  HttpResponse TooLarge(const HttpRequest& req, uint64_t limit);

 private:
  std::optional<HttpResponse> Refuse(const HttpRequest& req, std::string_view path,
                                     std::string_view query);
  HttpResponse AnswerPlain(const HttpRequest& req, std::string_view path, std::string_view query,
                           const boost::asio::ip::address& remote);
  // POST /v1/announces (tracker/swarms/batch.h), with this replica's tracker id in a header.
  HttpResponse AnswerBatch(const HttpRequest& req, const boost::asio::ip::address& remote);
  // Drops a HEAD answer's body (keeping its length) and counts the request under route.
  HttpResponse Finish(const HttpRequest& req, HttpResponse res, std::string_view route);

  TrackerService& service_;
  Access& access_;
  BlobApi& blobs_;
  ManifestApi& manifests_;
  PrefetchApi& prefetch_;
  std::function<std::string()> metrics_text_;
  std::function<std::string()> cluster_view_;
};

}  // namespace shoal::tracker
