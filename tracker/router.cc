#include "tracker/router.h"

#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/verb.hpp>

#include "tracker/cluster/cluster_view.h"
#include "tracker/cluster/page.h"
#include "tracker/swarms/batch.h"
#include "tracker/swarms/response.h"

namespace shoal::tracker {
namespace asio = boost::asio;
namespace http = boost::beast::http;

namespace {

constexpr char kServerName[] = "shoal-tracker";

enum class Route {
  kAnnounce,
  kAnnounceBatch,
  kScrape,
  kMetrics,
  kHealth,
  kStatus,
  kCluster,
  kUi,
  kNotFound
};

std::string_view RouteName(Route route) {
  switch (route) {
    case Route::kAnnounce:
      return "announce";
    case Route::kAnnounceBatch:
      return "announce-batch";
    case Route::kScrape:
      return "scrape";
    case Route::kMetrics:
      return "metrics";
    case Route::kHealth:
      return "health";
    case Route::kStatus:
      return "status";
    case Route::kCluster:
      return "cluster";
    case Route::kUi:
      return "ui";
    case Route::kNotFound:
      return "other";
  }
  return "other";
}

Route RouteOf(std::string_view path) {
  if (path == "/announce") return Route::kAnnounce;
  if (path == kAnnounceBatchPath) return Route::kAnnounceBatch;
  if (path == "/scrape") return Route::kScrape;
  if (path == "/metrics") return Route::kMetrics;
  if (path == "/healthz") return Route::kHealth;
  if (path == "/") return Route::kStatus;
  if (path == kClusterPath) return Route::kCluster;
  if (path == "/ui") return Route::kUi;
  return Route::kNotFound;
}

// The metrics label of a path.
std::string_view RouteLabel(std::string_view path) {
  if (BlobApi::Owns(path)) return "blobs";
  if (ManifestApi::Owns(path)) return "manifests";
  if (PrefetchApi::Owns(path)) return "prefetch";
  return RouteName(RouteOf(path));
}

struct Target {
  std::string_view path;
  std::string_view query;
};

Target Split(std::string_view target) {
  size_t q = target.find('?');
  return {target.substr(0, q),
          q == std::string_view::npos ? std::string_view() : target.substr(q + 1)};
}

// The whole of res on the wire (status line, headers, body).
std::string Serialize(HttpResponse& res) {
  std::string out;
  http::serializer<false, http::string_body> sr{res};
  boost::beast::error_code ec;
  while (!ec && !sr.is_done()) {
    sr.next(ec, [&](boost::beast::error_code&, const auto& buffers) {
      size_t n = 0;
      for (auto b : boost::beast::buffers_range_ref(buffers)) {
        out.append(static_cast<const char*>(b.data()), b.size());
        n += b.size();
      }
      sr.consume(n);
    });
  }
  return out;
}

}  // namespace

void LimitRequest(HttpRequestParser& parser) {
  parser.header_limit(kRequestHeaderLimit);
  parser.body_limit(kRequestBodyLimit);
}

std::optional<HttpRequest> ParseWholeRequest(std::string_view bytes) {
  HttpRequestParser parser;
  LimitRequest(parser);
  parser.eager(true);
  boost::beast::error_code ec;
  size_t used = 0;
  while (!ec && !parser.is_done() && used < bytes.size()) {
    size_t n = parser.put(asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (n == 0 && !ec) break;  // wants more than there is
    used += n;
  }
  if (ec || !parser.is_done() || used != bytes.size()) return std::nullopt;
  return parser.release();
}

std::optional<std::string> Router::AnswerFirstRead(std::string_view received,
                                                   const asio::ip::address& remote) {
  std::optional<HttpRequest> req = ParseWholeRequest(received);
  if (!req || req->keep_alive() || !(*req)[http::field::expect].empty()) return std::nullopt;
  std::optional<HttpResponse> res = AnswerNow(*req, remote);
  if (!res) return std::nullopt;
  return Serialize(*res);
}

HttpResponse MakeHttpResponse(unsigned version, bool keep_alive, http::status status,
                              std::string body, std::string_view content_type) {
  HttpResponse res{status, version};
  res.set(http::field::server, kServerName);
  res.set(http::field::content_type, content_type);
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

std::optional<HttpResponse> Router::AnswerNow(const HttpRequest& req,
                                              const asio::ip::address& remote) {
  auto [path, query] = Split(req.target());
  if (std::optional<HttpResponse> refused = Refuse(req, path, query)) {
    return Finish(req, std::move(*refused), RouteLabel(path));
  }
  if (BlobApi::Owns(path) || ManifestApi::Owns(path) || PrefetchApi::Owns(path)) {
    return std::nullopt;
  }
  return Finish(req, AnswerPlain(req, path, query, remote), RouteName(RouteOf(path)));
}

asio::awaitable<HttpResponse> Router::Answer(const HttpRequest& req, asio::ip::address remote) {
  if (std::optional<HttpResponse> now = AnswerNow(req, remote)) co_return std::move(*now);
  auto [path, query] = Split(req.target());
  BlobRequest api_req{req.method(), path, query, req.body(), remote};
  BlobResponse answer;
  std::string_view route;
  // Named results, not co_await temporaries: GCC 12 can destroy a co_await expression's
  // temporaries twice.
  if (BlobApi::Owns(path)) {
    answer = co_await blobs_.Handle(api_req);
    route = "blobs";
  } else if (ManifestApi::Owns(path)) {
    answer = co_await manifests_.Handle(api_req);
    route = "manifests";
  } else {
    answer = co_await prefetch_.Handle(api_req);
    route = "prefetch";
  }
  HttpResponse res =
      MakeHttpResponse(req.version(), req.keep_alive(), static_cast<http::status>(answer.status),
                       std::move(answer.body), "application/json");
  if (!answer.allow.empty()) res.set(http::field::allow, answer.allow);
  co_return Finish(req, std::move(res), route);
}

HttpResponse Router::TooLarge(const HttpRequest& req, uint64_t limit) {
  std::string message = "request body is larger than " + std::to_string(limit) + " bytes";
  std::string_view path = Split(req.target()).path;
  HttpResponse res;
  if (BlobApi::Owns(path) || ManifestApi::Owns(path) || PrefetchApi::Owns(path)) {
    BlobResponse answer = blobs_.Error(413, std::move(message));
    res = MakeHttpResponse(req.version(), false, http::status::payload_too_large,
                           std::move(answer.body), "application/json");
  } else {
    res = MakeHttpResponse(req.version(), false, http::status::payload_too_large, message + "\n",
                           "text/plain");
  }
  service_.metrics().CountRequest("other", res.result_int());
  return res;
}

HttpResponse Router::Finish(const HttpRequest& req, HttpResponse res, std::string_view route) {
  if (req.method() == http::verb::head) {
    size_t size = res.body().size();
    res.body().clear();
    res.content_length(size);
  }
  service_.metrics().CountRequest(route, res.result_int());
  return res;
}

// The refusal of a request whose credential does not admit it to path, or nullopt. Announce
// and scrape carry an agent's announce key in the query (auth=); everything else a bearer token.
std::optional<HttpResponse> Router::Refuse(const HttpRequest& req, std::string_view path,
                                           std::string_view query) {
  Role needed = RequiredRole(req.method(), path);
  Access::Verdict verdict = Access::Verdict::kAllowed;
  bool announce = path == "/announce" || path == "/scrape";
  std::string_view key = announce ? AnnounceKeyOf(query) : std::string_view();
  if (announce && !access_.open()) {
    if (key.empty()) {
      verdict = access_.Check(needed, req[http::field::authorization]);
    } else if (!access_.CheckAnnounceKey(key)) {
      verdict = Access::Verdict::kInvalid;
    }
  } else {
    verdict = access_.Check(needed, req[http::field::authorization]);
  }
  if (verdict == Access::Verdict::kAllowed) return std::nullopt;
  const std::string_view label = RouteLabel(path);
  access_.CountRefused(label, verdict);
  std::string text = RefusalText(verdict, needed);
  if (announce && key.empty() && verdict == Access::Verdict::kMissing) {
    text = "this tracker needs an agent's announce key: /announce?auth=<key>";
  }
  auto status = verdict == Access::Verdict::kForbidden ? http::status::forbidden
                                                       : http::status::unauthorized;
  HttpResponse res;
  if (announce) {
    res = MakeHttpResponse(req.version(), req.keep_alive(), status, EncodeFailure(text),
                           "text/plain");
  } else if (label == "blobs" || label == "manifests" || label == "prefetch" ||
             label == "cluster") {
    BlobResponse answer = blobs_.Error(static_cast<unsigned>(status), text);
    res = MakeHttpResponse(req.version(), req.keep_alive(), status, std::move(answer.body),
                           "application/json");
  } else {
    res = MakeHttpResponse(req.version(), req.keep_alive(), status, text + "\n", "text/plain");
  }
  if (status == http::status::unauthorized) {
    res.set(http::field::www_authenticate, "Bearer realm=\"shoal-tracker\"");
  }
  return res;
}

HttpResponse Router::AnswerBatch(const HttpRequest& req, const asio::ip::address& remote) {
  if (req.method() != http::verb::post) {
    HttpResponse res = MakeHttpResponse(
        req.version(), req.keep_alive(), http::status::method_not_allowed,
        std::string(req.method_string()) + " is not supported; use POST\n", "text/plain");
    res.set(http::field::allow, "POST");
    return res;
  }
  BatchAnswer answer = AnswerAnnounceBatch(service_, req.body(), remote, TrackerClock::now());
  HttpResponse res = MakeHttpResponse(req.version(), req.keep_alive(),
                                      static_cast<http::status>(answer.status),
                                      answer.status == 200 ? std::move(answer.body)
                                                           : std::move(answer.body) + "\n",
                                      "text/plain");
  res.set("Shoal-Tracker-Id", blobs_.tracker_id());
  return res;
}

HttpResponse Router::AnswerPlain(const HttpRequest& req, std::string_view path,
                                 std::string_view query, const asio::ip::address& remote) {
  unsigned v = req.version();
  bool keep = req.keep_alive();
  if (RouteOf(path) == Route::kAnnounceBatch) return AnswerBatch(req, remote);
  if (req.method() != http::verb::get && req.method() != http::verb::head) {
    HttpResponse res = MakeHttpResponse(
        v, keep, http::status::method_not_allowed,
        std::string(req.method_string()) + " is not supported; use GET\n", "text/plain");
    res.set(http::field::allow, "GET, HEAD");
    return res;
  }
  switch (RouteOf(path)) {
    case Route::kAnnounce:
      return MakeHttpResponse(v, keep, http::status::ok,
                              service_.Announce(query, remote, TrackerClock::now()),
                              "text/plain");
    case Route::kScrape:
      return MakeHttpResponse(v, keep, http::status::ok, service_.Scrape(query), "text/plain");
    case Route::kMetrics:
      service_.UpdateGauges();
      blobs_.Sweep(TrackerClock::now());
      manifests_.Sweep(TrackerClock::now());
      prefetch_.Sweep(TrackerClock::now());
      return MakeHttpResponse(v, keep, http::status::ok, metrics_text_ ? metrics_text_() : "",
                              "text/plain; version=0.0.4");
    case Route::kHealth:
      return MakeHttpResponse(v, keep, http::status::ok, "ok\n", "text/plain");
    case Route::kStatus:
      if (!access_.IsOperator(req[http::field::authorization])) {
        // Totals only: swarms, leases, manifests and jobs name images.
        return MakeHttpResponse(v, keep, http::status::ok,
                                service_.StatusPage(false) +
                                    "\nswarms, leases, manifests and prefetch jobs: send an "
                                    "operator token (Authorization: Bearer <token>)\n",
                                "text/plain; charset=utf-8");
      }
      return MakeHttpResponse(
          v, keep, http::status::ok,
          service_.StatusPage(true) + "\n" + blobs_.StatusSection(TrackerClock::now()) +
              manifests_.StatusSection() + prefetch_.StatusSection(TrackerClock::now()),
          "text/plain; charset=utf-8");
    case Route::kCluster:
      return MakeHttpResponse(v, keep, http::status::ok, cluster_view_ ? cluster_view_() : "{}",
                              "application/json");
    case Route::kUi: {
      // The page itself holds no data: it asks for an operator token and reads /v1/cluster.
      // Nothing on it may load from anywhere else.
      HttpResponse res = MakeHttpResponse(v, keep, http::status::ok,
                                          std::string(ClusterPageHtml()),
                                          "text/html; charset=utf-8");
      res.set("Content-Security-Policy",
              "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
              "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
              "frame-ancestors 'none'");
      res.set("X-Content-Type-Options", "nosniff");
      return res;
    }
    case Route::kAnnounceBatch:  // answered above, whatever the method
    case Route::kNotFound:
      break;
  }
  std::string shown(req.target().substr(0, 200));
  return MakeHttpResponse(v, keep, http::status::not_found, "no such endpoint: " + shown + "\n",
                          "text/plain");
}

}  // namespace shoal::tracker
