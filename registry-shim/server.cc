#include "registry-shim/server.h"

#include <sys/sendfile.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <type_traits>
#include <vector>

#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include "lib/http/range.h"
#include "lib/oci/manifest.h"
#include "lib/oci/reference.h"
#include "registry-shim/errors.h"
#include "registry-shim/link.h"
#include "registry-shim/route.h"

namespace shoal::shim {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;

namespace {

constexpr char kApiVersionHeader[] = "Docker-Distribution-API-Version";
constexpr char kApiVersion[] = "registry/2.0";
// Bytes per sendfile call. The network thread yields after each call so that one fast client
// cannot keep the others waiting (like nginx's sendfile_max_chunk); measured with 8 clients.
constexpr uint64_t kSendfileChunk = 1 << 20;
// Bytes per pread + write on a TLS connection (sendfile cannot encrypt).
constexpr size_t kCopyChunk = 256 << 10;

using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

using Request = http::request<http::empty_body>;
using StringResponse = http::response<http::string_body>;

StringResponse MakeResponse(const Request& req, http::status status, std::string body,
                            std::string_view content_type) {
  StringResponse res{status, req.version()};
  res.set(http::field::server, "shoal-agent");
  res.set(kApiVersionHeader, kApiVersion);
  if (!content_type.empty()) res.set(http::field::content_type, content_type);
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

StringResponse MakeError(const Request& req, const Error& err, std::string_view oci_code) {
  ErrorReply reply = MakeErrorReply(err, oci_code);
  if (reply.redacted) {
    // The client's message has the addresses cut out; the operator gets them here.
    spdlog::info("shim: {} {} answered {}: {}", std::string(req.method_string()),
                 std::string(req.target().substr(0, 300)), reply.status, err.ToString());
  }
  StringResponse res =
      MakeResponse(req, static_cast<http::status>(reply.status),
                   req.method() == http::verb::head ? "" : reply.body, "application/json");
  if (reply.retry_after_s > 0)
    res.set(http::field::retry_after, std::to_string(reply.retry_after_s));
  if (req.method() == http::verb::head) res.content_length(reply.body.size());
  return res;
}

std::string_view RouteName(Route::Kind kind) {
  switch (kind) {
    case Route::Kind::kBase:
      return "base";
    case Route::Kind::kManifest:
      return "manifest";
    case Route::Kind::kBlob:
      return "blob";
    case Route::Kind::kMetrics:
      return "metrics";
    case Route::Kind::kHealth:
      return "health";
    case Route::Kind::kPush:
      return "push";
    case Route::Kind::kTags:
      return "tags";
    case Route::Kind::kReferrers:
      return "referrers";
    case Route::Kind::kNotFound:
      return "other";
  }
  return "other";
}

// What every connection of one server shares: references to the Server's members, built per
// connection by Server::Session and handed on to the TLS connection inside a CONNECT.
struct ServerEnv {
  Backend& backend;
  Metrics& metrics;
  const ServerOptions& options;
  const std::function<std::string()>& metrics_text;
  const AdminHandler& admin;
  const ProxyOptions* proxy;  // null: the proxy mode is off
};

bool IsLoopbackPeer(const tcp::socket& socket) {
  beast::error_code ec;
  auto remote = socket.remote_endpoint(ec);
  return !ec && remote.address().is_loopback();
}

// Whether the peer runs on this node: loopback, or it connected from the very address it
// connected to (a client on the node dialling the node's IP, as dockerd does with AGENT=NODE_IP).
bool IsSameNodePeer(const tcp::socket& socket) {
  beast::error_code ec, local_ec;
  auto remote = socket.remote_endpoint(ec);
  auto local = socket.local_endpoint(local_ec);
  if (ec || local_ec) return false;
  return remote.address().is_loopback() || remote.address() == local.address();
}

// A connection being served, over plain TCP or (inside a terminated CONNECT) over TLS; the
// handlers below are its steps. Responses are built in named variables before being passed to
// co_await: GCC 12 can destroy temporaries of a co_await expression twice (seen as double
// frees), so no co_await here takes a non-trivial temporary.
template <class Stream>
class Connection {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

 public:
  // connect_registry: the registry of the terminated CONNECT this TLS connection serves.
  Connection(Stream stream, const ServerEnv& env, std::string connect_registry = "")
      : stream_(std::move(stream)),
        backend_(env.backend),
        metrics_(env.metrics),
        options_(env.options),
        env_(env),
        connect_registry_(std::move(connect_registry)) {}

  awaitable<void> Run() {
    beast::flat_buffer buffer;
    for (;;) {
      http::request_parser<http::empty_body> parser;
      parser.header_limit(32 * 1024);
      beast::error_code ec;
      Lowest().expires_after(options_.idle_timeout);
      co_await http::async_read(stream_, buffer, parser, asio::redirect_error(use_awaitable, ec));
      if (ec == http::error::end_of_stream || ec == asio::error::eof ||
          ec == beast::error::timeout || ec == asio::error::connection_reset ||
          ec == asio::ssl::error::stream_truncated) {
        break;
      }
      if (ec) {
        // Malformed HTTP: answer 400 once, then close.
        Request dummy;
        dummy.version(11);
        dummy.keep_alive(false);
        auto res = ErrorResponse(dummy,
                                 shoal::MakeError(ErrorCode::kInvalidArgument,
                                                  "malformed HTTP request: " + ec.message()),
                                 "UNSUPPORTED");
        res.keep_alive(false);
        co_await Write(std::move(res));
        break;
      }
      Request req = parser.release();
      Lowest().expires_never();
      if constexpr (!kTls) {
        // After a CONNECT this connection is a tunnel (or closed): no more requests on it.
        if (req.method() == http::verb::connect) co_return co_await HandleConnect(req, buffer);
      }
      bool keep = co_await Handle(req);
      if (!keep || !req.keep_alive()) break;
    }
    beast::error_code ec;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ec);
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  // MakeError, counting refused registries: every error answer of a connection is built here.
  StringResponse ErrorResponse(const Request& req, const Error& err, std::string_view oci_code) {
    if (err.code == ErrorCode::kRefused) metrics_.refused_registries.Increment();
    return MakeError(req, err, oci_code);
  }

  awaitable<bool> Write(StringResponse res) {
    beast::error_code ec;
    Lowest().expires_after(options_.stall_timeout);
    co_await http::async_write(stream_, res, asio::redirect_error(use_awaitable, ec));
    Lowest().expires_never();
    co_return !ec;
  }

  awaitable<bool> Reply(Route::Kind kind, StringResponse res) {
    // RFC 9110 15.5.6: a 405 says which methods the resource has.
    if (res.result() == http::status::method_not_allowed &&
        res.find(http::field::allow) == res.end()) {
      res.set(http::field::allow, AllowedMethods(kind));
    }
    metrics_.CountRequest(RouteName(kind), res.result_int());
    co_return co_await Write(std::move(res));
  }

  // The admin API (/shoal/v1/...): loopback only unless configured otherwise.
  awaitable<bool> HandleAdmin(const Request& req) {
    StringResponse res;
    if (req.target() == "/shoal/v1/proxy/ca.crt") {
      // The proxy CA's certificate, for clients to trust: public, so any client may read it
      // (a node's dockerd fetches it from NODE_IP). The key is never served.
      if (!env_.proxy) {
        res = MakeResponse(
            req, http::status::not_found,
            R"({"error":"the HTTPS proxy mode is off: start the agent with --https-proxy"})",
            "application/json");
      } else if (req.method() != http::verb::get) {
        res = MakeResponse(req, http::status::method_not_allowed,
                           R"({"error":"GET /shoal/v1/proxy/ca.crt"})", "application/json");
        res.set(http::field::allow, "GET");
      } else {
        res =
            MakeResponse(req, http::status::ok, env_.proxy->ca_cert_pem, "application/x-pem-file");
      }
    } else if (!options_.admin_any_address && !IsLoopbackPeer(Lowest().socket())) {
      res = MakeResponse(req, http::status::forbidden,
                         R"({"error":"the admin API answers loopback clients only"})",
                         "application/json");
    } else if (!env_.admin) {
      res = MakeResponse(req, http::status::not_found, R"({"error":"no admin API here"})",
                         "application/json");
    } else {
      std::string method(req.method_string());
      std::string target(req.target());
      AdminReply reply = co_await env_.admin(method, target);
      res = MakeResponse(req, static_cast<http::status>(reply.status), std::move(reply.body),
                         "application/json");
      if (reply.status == 405) res.set(http::field::allow, reply.allow);
    }
    metrics_.CountRequest("admin", res.result_int());
    co_return co_await Write(std::move(res));
  }

  awaitable<bool> Handle(const Request& req) {
    if (env_.options.metrics_only) co_return co_await HandleMetricsOnly(req);
    if (connect_registry_.empty() && req.target().starts_with("/shoal/v1/"))
      co_return co_await HandleAdmin(req);
    auto route = ParseRoute(req.target());
    if (!route) {
      StringResponse reply_ = ErrorResponse(req, route.error(), "NAME_INVALID");
      co_return co_await Reply(Route::Kind::kNotFound, std::move(reply_));
    }
    Route r = route.value();
    // Inside a terminated CONNECT only the registry API is served, as that registry.
    if (!connect_registry_.empty() &&
        (r.kind == Route::Kind::kMetrics || r.kind == Route::Kind::kHealth)) {
      r.kind = Route::Kind::kNotFound;
    }
    bool read_only = req.method() == http::verb::get || req.method() == http::verb::head;
    if (req.method() == http::verb::options && r.kind != Route::Kind::kNotFound) {
      // What the resource allows, as docker-registry answers OPTIONS (200 with Allow).
      StringResponse reply_ = MakeResponse(req, http::status::ok, "", "");
      reply_.set(http::field::allow, AllowedMethods(r.kind));
      co_return co_await Reply(r.kind, std::move(reply_));
    }
    if (r.kind == Route::Kind::kPush || (!read_only && r.kind != Route::Kind::kNotFound)) {
      {
        StringResponse reply_ = ErrorResponse(
            req,
            shoal::MakeError(ErrorCode::kUnsupported, "shoal is a pull-only mirror; " +
                                                          std::string(req.method_string()) +
                                                          " is not supported"),
            "UNSUPPORTED");
        co_return co_await Reply(r.kind, std::move(reply_));
      }
    }
    switch (r.kind) {
      case Route::Kind::kBase: {
        StringResponse reply_ = MakeResponse(req, http::status::ok, "{}", "application/json");
        co_return co_await Reply(r.kind, std::move(reply_));
      }
      case Route::Kind::kHealth: {
        StringResponse reply_ = MakeResponse(req, http::status::ok, "ok\n", "text/plain");
        co_return co_await Reply(r.kind, std::move(reply_));
      }
      case Route::Kind::kMetrics: {
        StringResponse reply_ =
            MakeResponse(req, http::status::ok, env_.metrics_text ? env_.metrics_text() : "",
                         "text/plain; version=0.0.4");
        co_return co_await Reply(r.kind, std::move(reply_));
      }
      case Route::Kind::kManifest:
        co_return co_await HandleManifest(req, r);
      case Route::Kind::kBlob:
        co_return co_await HandleBlob(req, r);
      case Route::Kind::kTags:
      case Route::Kind::kReferrers:
        co_return co_await HandleListing(req, r);
      default: {
        // Not NAME_UNKNOWN: the repository may well exist (docker-registry answers a plain 404).
        StringResponse reply_ =
            ErrorResponse(req,
                          shoal::MakeError(ErrorCode::kNotFound,
                                           "no such endpoint in the pull API this mirror serves: " +
                                               std::string(req.target().substr(0, 200))),
                          "UNSUPPORTED");
        co_return co_await Reply(r.kind, std::move(reply_));
      }
    }
  }

  // A metrics-only listener: /metrics and /healthz; nothing of the pull or admin API.
  awaitable<bool> HandleMetricsOnly(const Request& req) {
    std::string_view target = req.target();
    std::string_view path = target.substr(0, target.find('?'));
    Route::Kind kind = path == "/metrics"   ? Route::Kind::kMetrics
                       : path == "/healthz" ? Route::Kind::kHealth
                                            : Route::Kind::kNotFound;
    StringResponse reply_;
    if (kind == Route::Kind::kNotFound) {
      reply_ = MakeResponse(req, http::status::not_found,
                            "this listener serves only /metrics and /healthz\n", "text/plain");
    } else if (req.method() != http::verb::get && req.method() != http::verb::head) {
      reply_ = MakeResponse(req, http::status::method_not_allowed, "use GET\n", "text/plain");
      reply_.set(http::field::allow, "GET, HEAD");
    } else if (kind == Route::Kind::kHealth) {
      reply_ = MakeResponse(req, http::status::ok, "ok\n", "text/plain");
    } else {
      reply_ = MakeResponse(req, http::status::ok, env_.metrics_text ? env_.metrics_text() : "",
                            "text/plain; version=0.0.4");
    }
    co_return co_await Reply(kind, std::move(reply_));
  }

  awaitable<bool> HandleManifest(const Request& req, const Route& r) {
    std::string_view oci_code;
    auto repo = ServedRepo(r, oci_code);
    if (!repo) {
      StringResponse reply_ = ErrorResponse(req, repo.error(), oci_code);
      co_return co_await Reply(r.kind, std::move(reply_));
    }
    auto ref = oci::ParseManifestRef(r.reference);
    if (!ref) {
      bool looks_digest = r.reference.find(':') != std::string::npos;
      if (looks_digest) {
        ref.error().code = ErrorCode::kInvalidArgument;
        StringResponse reply_ = ErrorResponse(req, ref.error(), "DIGEST_INVALID");
        co_return co_await Reply(r.kind, std::move(reply_));
      }
      // No manifest can have an invalid tag: the distribution spec's answer for a manifest that
      // does not exist (404 MANIFEST_UNKNOWN), without asking upstream.
      Error unknown = ref.error();
      unknown.code = ErrorCode::kNotFound;
      unknown.message = "manifest unknown: " + unknown.message;
      StringResponse reply_ = ErrorResponse(req, unknown, "MANIFEST_UNKNOWN");
      co_return co_await Reply(r.kind, std::move(reply_));
    }
    std::string accept_header;
    for (const auto& field : req) {
      if (field.name() == http::field::accept) {
        if (!accept_header.empty()) accept_header += ",";
        accept_header += std::string(field.value());
      }
    }
    auto accept = oci::ParseAccept(accept_header);
    {
      StringResponse refused;
      const PullTarget target{PullTarget::Kind::kManifest, r.reference};
      if (!co_await Authorized(req, repo.value(), target, refused))
        co_return co_await Reply(r.kind, std::move(refused));
    }
    auto manifest = co_await backend_.GetManifest(repo.value(), r.reference, accept);
    if (!manifest) {
      {
        StringResponse reply_ = ErrorResponse(req, manifest.error(), "MANIFEST_UNKNOWN");
        co_return co_await Reply(r.kind, std::move(reply_));
      }
    }
    ManifestResult& m = manifest.value();
    oci::Negotiation chosen =
        oci::NegotiateManifest(accept, m.media_type, m.body, !ref.value().IsDigest());
    if (chosen.kind == oci::Negotiation::Kind::kChild) {
      // A schema2-only client asking for a list by tag gets its linux/amd64 image.
      const std::string child_ref = chosen.child->str();
      auto child = co_await backend_.GetManifest(repo.value(), child_ref, accept);
      if (!child) {
        StringResponse reply_ = ErrorResponse(req, child.error(), "MANIFEST_UNKNOWN");
        co_return co_await Reply(r.kind, std::move(reply_));
      }
      if (!oci::Accepts(accept, child.value().media_type)) {
        chosen.kind = oci::Negotiation::Kind::kRefuse;
        chosen.reason = "its linux/amd64 manifest is " + child.value().media_type +
                        ", which the client does not accept";
      } else {
        m = std::move(child.value());
      }
    }
    if (chosen.kind == oci::Negotiation::Kind::kRefuse) {
      StringResponse reply_ =
          ErrorResponse(req,
                        shoal::MakeError(ErrorCode::kNotFound,
                                         "manifest " + repo.value().str() + ":" + r.reference +
                                             " is not served: " + chosen.reason),
                        "MANIFEST_UNKNOWN");
      co_return co_await Reply(r.kind, std::move(reply_));
    }
    bool head = req.method() == http::verb::head;
    size_t size = m.body.size();
    StringResponse res =
        MakeResponse(req, http::status::ok, head ? "" : std::move(m.body), m.media_type);
    res.set("Docker-Content-Digest", m.digest.str());
    res.set(http::field::etag, "\"" + m.digest.str() + "\"");
    if (head) res.content_length(size);
    co_return co_await Reply(r.kind, std::move(res));
  }

  awaitable<bool> HandleBlob(const Request& req, const Route& r) {
    const auto started = std::chrono::steady_clock::now();
    std::string_view oci_code;
    auto repo = ServedRepo(r, oci_code);
    if (!repo) {
      StringResponse reply_ = ErrorResponse(req, repo.error(), oci_code);
      co_return co_await Reply(r.kind, std::move(reply_));
    }
    auto digest = Digest::Parse(r.reference);
    if (!digest) {
      // An unsupported algorithm is still an invalid digest for this endpoint: 400, not 405.
      Error e = digest.error();
      e.code = ErrorCode::kInvalidArgument;
      {
        StringResponse reply_ = ErrorResponse(req, e, "DIGEST_INVALID");
        co_return co_await Reply(r.kind, std::move(reply_));
      }
    }
    {
      StringResponse refused;
      const PullTarget target{PullTarget::Kind::kBlob, digest.value().str()};
      if (!co_await Authorized(req, repo.value(), target, refused))
        co_return co_await Reply(r.kind, std::move(refused));
    }
    auto opened = co_await backend_.OpenBlob(repo.value(), digest.value());
    if (!opened) {
      StringResponse reply_ = ErrorResponse(req, opened.error(), "BLOB_UNKNOWN");
      co_return co_await Reply(r.kind, std::move(reply_));
    }
    std::shared_ptr<BlobReader> reader = opened.value();
    uint64_t size = reader->size();
    uint64_t first = 0, last = size == 0 ? 0 : size - 1;
    bool partial = false;
    if (auto range_it = req.find(http::field::range); range_it != req.end()) {
      auto range = ::shoal::http::ParseRange(range_it->value(), size);
      if (!range && range.error().code == ErrorCode::kUnsupported) {
        // Several ranges (RFC 9110 lets a server ignore Range) or a unit other than bytes (it
        // must ignore the header): send the whole blob.
      } else if (!range) {
        StringResponse res = ErrorResponse(req, range.error(), "RANGE_INVALID");
        if (range.error().code == ErrorCode::kRangeNotSatisfiable) {
          res.set(http::field::content_range, "bytes */" + std::to_string(size));
        }
        co_return co_await Reply(r.kind, std::move(res));
      } else {
        first = range.value().first;
        last = range.value().last;
        partial = true;
      }
    }
    uint64_t length = size == 0 ? 0 : last - first + 1;
    if (req.method() != http::verb::head && length > 0) {
      // A fetch that fails before the first byte of the answer is answered with its status
      // (503 with Retry-After for a dead upstream, 502 for bad bytes, 507 when it cannot fit),
      // not with a 200 cut short: the runtime then reports why.
      auto ready = co_await reader->WaitReadable(first);
      if (!ready) {
        StringResponse res = ErrorResponse(req, ready.error(), "BLOB_UNKNOWN");
        co_return co_await Reply(r.kind, std::move(res));
      }
    }

    http::response<http::empty_body> res{partial ? http::status::partial_content : http::status::ok,
                                         req.version()};
    res.set(http::field::server, "shoal-agent");
    res.set(kApiVersionHeader, kApiVersion);
    res.set(http::field::content_type, "application/octet-stream");
    res.set(http::field::accept_ranges, "bytes");
    res.set("Docker-Content-Digest", digest.value().str());
    res.set(http::field::etag, "\"" + digest.value().str() + "\"");
    if (partial)
      res.set(http::field::content_range, ::shoal::http::ContentRange(range_of(first, last), size));
    res.content_length(length);
    res.keep_alive(req.keep_alive());
    metrics_.CountRequest(RouteName(r.kind), res.result_int());

    beast::error_code ec;
    http::response_serializer<http::empty_body> sr{res};
    Lowest().expires_after(options_.stall_timeout);
    co_await http::async_write_header(stream_, sr, asio::redirect_error(use_awaitable, ec));
    Lowest().expires_never();
    if (ec) co_return false;
    if (req.method() == http::verb::head || length == 0) co_return true;
    co_return co_await SendBody(*reader, first, first + length, digest.value(), started);
  }

  // tags/list and referrers/<digest>: passed to the upstream (a pull-only mirror still lists),
  // with n/last (tags) or artifactType (referrers) and the Link of the next page, rewritten to
  // point at this shim. Nothing is cached.
  awaitable<bool> HandleListing(const Request& req, const Route& r) {
    std::string_view oci_code;
    auto repo = ServedRepo(r, oci_code);
    if (!repo) {
      StringResponse reply_ = ErrorResponse(req, repo.error(), oci_code);
      co_return co_await Reply(r.kind, std::move(reply_));
    }
    const bool tags = r.kind == Route::Kind::kTags;
    std::string endpoint = "tags/list";
    if (!tags) {
      auto digest = Digest::Parse(r.reference);
      if (!digest) {
        Error e = digest.error();
        e.code = ErrorCode::kInvalidArgument;
        StringResponse reply_ = ErrorResponse(req, e, "DIGEST_INVALID");
        co_return co_await Reply(r.kind, std::move(reply_));
      }
      endpoint = "referrers/" + digest.value().str();
    }
    auto query =
        tags ? ForwardedQuery(r.query, {"n", "last"}) : ForwardedQuery(r.query, {"artifactType"});
    if (!query) {
      StringResponse reply_ = ErrorResponse(req, query.error(), "UNSUPPORTED");
      co_return co_await Reply(r.kind, std::move(reply_));
    }
    {
      StringResponse refused;
      const PullTarget target{PullTarget::Kind::kListing, ""};
      if (!co_await Authorized(req, repo.value(), target, refused))
        co_return co_await Reply(r.kind, std::move(refused));
    }
    auto listed = co_await backend_.GetListing(repo.value(), endpoint, query.value());
    if (!listed) {
      StringResponse reply_ =
          ErrorResponse(req, listed.error(), tags ? "NAME_UNKNOWN" : "UNSUPPORTED");
      co_return co_await Reply(r.kind, std::move(reply_));
    }
    ListingResult& l = listed.value();
    if (l.status == 404) {
      // The upstream's own code when it sent one; a registry without the referrers API sends a
      // plain 404, which clients take as "use the tag schema".
      std::string code = !l.error_code.empty() ? l.error_code
                         : tags                ? "NAME_UNKNOWN"
                                               : "UNSUPPORTED";
      const Error missing = shoal::MakeError(
          ErrorCode::kNotFound,
          std::string(tags ? "tags of " : "referrers in ") + repo.value().str() +
              (l.error_code.empty() ? ": the upstream answered 404"
                                    : ": the upstream answered 404 " + l.error_code));
      StringResponse reply_ = ErrorResponse(req, missing, code);
      co_return co_await Reply(r.kind, std::move(reply_));
    }
    const bool head = req.method() == http::verb::head;
    const size_t size = l.body.size();
    StringResponse res = MakeResponse(req, http::status::ok, head ? "" : std::move(l.body),
                                      l.content_type.empty() ? "application/json" : l.content_type);
    if (head) res.content_length(size);
    if (!l.link.empty()) {
      if (auto link = RewriteLink(l.link, r.path, r.ns)) res.set(http::field::link, *link);
    }
    if (!l.filters_applied.empty()) res.set("OCI-Filters-Applied", l.filters_applied);
    co_return co_await Reply(r.kind, std::move(res));
  }

  // Asks the backend whether this client may be served target of repo; on a refusal fills
  // `refusal_reply` (401 with the Basic challenge when the backend asks for credentials).
  awaitable<bool> Authorized(const Request& req, const RepoRef& repo, const PullTarget& target,
                             StringResponse& refusal_reply) {
    std::string authorization;
    if (auto it = req.find(http::field::authorization); it != req.end())
      authorization = std::string(it->value());
    auto refusal = co_await backend_.AuthorizePull(repo, target, authorization);
    if (!refusal) co_return true;
    refusal_reply = ErrorResponse(req, refusal->error, refusal->oci_code);
    if (refusal->challenge) refusal_reply.set(http::field::www_authenticate, kPullAuthChallenge);
    co_return false;
  }

  // The repository a request is for (Resolve) if this node serves its registry; on an error
  // oci_code is the OCI code to answer with (NAME_INVALID, NAME_UNKNOWN).
  Result<RepoRef> ServedRepo(const Route& r, std::string_view& oci_code) const {
    auto repo = Resolve(r);
    if (!repo) {
      oci_code = "NAME_INVALID";
      return repo;
    }
    if (auto served = backend_.CheckRegistry(repo.value()); !served) {
      oci_code = "NAME_UNKNOWN";
      return served.error();
    }
    return repo;
  }

  // The repository a request is for: the tunnel's registry inside a terminated CONNECT, else
  // by the shim's mirror modes.
  Result<RepoRef> Resolve(const Route& r) const {
    if (!connect_registry_.empty()) return ResolveConnectRepo(r.name, connect_registry_);
    return ResolveRepo(r.name, r.ns, options_.default_registry);
  }

  static ::shoal::http::ByteRange range_of(uint64_t first, uint64_t last) {
    ::shoal::http::ByteRange r;
    r.first = first;
    r.last = last;
    return r;
  }

  // Streams [begin, end) of the blob, waiting for in-flight bytes as needed: only bytes that
  // WaitReadable calls safe are sent (an in-flight blob's last byte only once it matched its
  // digest). On a failed fetch the connection is closed mid-body, so the client sees a
  // truncated response and never a complete one with wrong bytes.
  // `started`: when the request was read; the time to the first body byte and to the last go to
  // the blob-time histograms by the reader's source.
  awaitable<bool> SendBody(BlobReader& reader, uint64_t begin, uint64_t end, const Digest& digest,
                           std::chrono::steady_clock::time_point started) {
    uint64_t offset = begin;
    bool first_byte = true;
    // A Range answer that ends before the blob's last byte holds its own last byte until the
    // blob is known to be intact (a cached blob is hashed again the first time it is served).
    const uint64_t hold = end < reader.size() ? end - 1 : end;
    while (offset < end) {
      if (offset == hold) {
        Status verified = co_await reader.WaitVerified();
        if (!verified) {
          spdlog::error("aborting response for {}: {}", digest.str(), verified.error().ToString());
          co_return Abort("fetch_failed");
        }
      }
      auto readable = co_await reader.WaitReadable(offset);
      if (!readable) {
        spdlog::error("aborting response for {}: {}", digest.str(), readable.error().ToString());
        co_return Abort("fetch_failed");
      }
      uint64_t avail = std::min<uint64_t>(readable.value(), offset < hold ? hold : end);
      bool sent = co_await SendRange(reader, offset, avail, digest);
      if (!sent) co_return false;
      if (first_byte) {
        first_byte = false;
        metrics_.ObserveBlobTime("first_byte", reader.source(),
                                 std::chrono::steady_clock::now() - started);
      }
    }
    metrics_.ObserveBlobTime("complete", reader.source(), std::chrono::steady_clock::now() - started);
    co_return true;
  }

  // Sends the blob's bytes [offset, avail), all safe to send, and advances offset to avail.
  // Returns false (after aborting the connection) when the client or the file failed.
  awaitable<bool> SendRange(BlobReader& reader, uint64_t& offset, uint64_t avail,
                            const Digest& digest) {
    if constexpr (kTls) {
      // pread into a bounded buffer and write it through TLS.
      std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(avail - offset, kCopyChunk)));
      while (offset < avail) {
        size_t want = static_cast<size_t>(std::min<uint64_t>(avail - offset, buf.size()));
        ssize_t n = ::pread(reader.fd(), buf.data(), want, static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          spdlog::error("reading the blob file for {} at {} failed: {}", digest.str(), offset,
                        n == 0 ? "ended before its size" : std::strerror(errno));
          co_return Abort("file_error");
        }
        beast::error_code ec;
        Lowest().expires_after(options_.stall_timeout);
        co_await asio::async_write(stream_, asio::buffer(buf.data(), static_cast<size_t>(n)),
                                   asio::redirect_error(use_awaitable, ec));
        Lowest().expires_never();
        if (ec) {
          spdlog::info("client stopped reading {} at offset {}: {}", digest.str(), offset,
                       ec.message());
          co_return Abort("client_gone");
        }
        offset += static_cast<uint64_t>(n);
        metrics_.CountBlobBytes(reader.source(), static_cast<uint64_t>(n));
      }
      co_return true;
    } else {
      co_return co_await SendfileRange(reader, offset, avail, digest);
    }
  }

  // SendRange for plain TCP: sendfile(2) straight from the page cache.
  awaitable<bool> SendfileRange(BlobReader& reader, uint64_t& offset_out, uint64_t avail,
                                const Digest& digest) {
    tcp::socket& sock = Lowest().socket();
    sock.non_blocking(true);
    off_t offset = static_cast<off_t>(offset_out);
    while (static_cast<uint64_t>(offset) < avail) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(avail - offset, kSendfileChunk));
      ssize_t n = ::sendfile(sock.native_handle(), reader.fd(), &offset, want);
      offset_out = static_cast<uint64_t>(offset);
      if (n > 0) {
        metrics_.CountBlobBytes(reader.source(), static_cast<uint64_t>(n));
        auto ex = sock.get_executor();
        co_await asio::post(ex, use_awaitable);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        beast::error_code ec;
        // The timer's handler may run after this frame moved on, so it shares its flag.
        asio::steady_timer watchdog(sock.get_executor());
        auto stalled = std::make_shared<bool>(false);
        auto done = std::make_shared<bool>(false);
        watchdog.expires_after(options_.stall_timeout);
        watchdog.async_wait([stalled, done, &sock](beast::error_code tec) {
          if (!tec && !*done) {
            *stalled = true;
            beast::error_code ignored;
            sock.cancel(ignored);
          }
        });
        co_await sock.async_wait(tcp::socket::wait_write, asio::redirect_error(use_awaitable, ec));
        *done = true;
        watchdog.cancel();
        if (ec || *stalled) {
          spdlog::info("client stopped reading {} at offset {}{}", digest.str(), offset,
                       *stalled ? " (stalled)" : "");
          co_return Abort("client_gone");
        }
        continue;
      }
      if (n == 0) {
        spdlog::error("blob file for {} ended at {} before its size", digest.str(), offset);
        co_return Abort("file_error");
      }
      if (errno == EPIPE || errno == ECONNRESET) {
        spdlog::info("client closed the connection during {} at offset {}", digest.str(), offset);
        co_return Abort("client_gone");
      }
      spdlog::warn("sendfile for {} failed: {}", digest.str(), std::strerror(errno));
      co_return Abort("file_error");
    }
    co_return true;
  }

  // ---- CONNECT (plain connections only) ----

  // Writes raw bytes (a CONNECT's 200 has no Content-Length, which Beast would add).
  awaitable<bool> WriteRaw(std::string_view bytes) {
    beast::error_code ec;
    Lowest().expires_after(options_.stall_timeout);
    co_await asio::async_write(Lowest().socket(), asio::buffer(bytes.data(), bytes.size()),
                               asio::redirect_error(use_awaitable, ec));
    Lowest().expires_never();
    co_return !ec;
  }

  // Answers a CONNECT that is refused or failed, and ends the connection.
  awaitable<void> RefuseConnect(const Request& req, const Error& err) {
    StringResponse res = ErrorResponse(req, err, "");
    res.keep_alive(false);
    if (res.result() == http::status::method_not_allowed) res.set(http::field::allow, "GET, HEAD");
    metrics_.CountRequest("connect", res.result_int());
    co_await Write(std::move(res));
  }

  awaitable<void> HandleConnect(const Request& req, beast::flat_buffer& buffer) {
    if (!env_.proxy) {
      const Error off = shoal::MakeError(
          ErrorCode::kUnsupported, "this agent is not an HTTPS proxy: CONNECT needs --https-proxy");
      co_return co_await RefuseConnect(req, off);
    }
    auto target = ParseConnectTarget(req.target());
    if (!target) co_return co_await RefuseConnect(req, target.error());
    const ProxyOptions& proxy = *env_.proxy;
    const std::string registry = target.value().Registry();
    if (proxy.terminates && proxy.terminates(registry)) {
      co_return co_await Terminate(req, target.value(), registry, buffer);
    }
    if (!proxy.allow_tunnel || !IsSameNodePeer(Lowest().socket())) {
      metrics_.CountConnect("denied");
      spdlog::info("CONNECT {} refused: not in the upstream map and tunnels are {}",
                   std::string(req.target()),
                   proxy.allow_tunnel ? "for clients on this node only" : "off");
      const Error denied = shoal::MakeError(
          ErrorCode::kDenied, "CONNECT to " + std::string(req.target()) +
                                  " refused: it is not a registry in this agent's upstream map "
                                  "and " +
                                  (proxy.allow_tunnel ? "tunnels are for clients on this node only"
                                                      : "tunnels are off (--proxy-tunnel=deny)"));
      co_return co_await RefuseConnect(req, denied);
    }
    metrics_.CountConnect("tunnel");
    auto ex = Lowest().get_executor();
    auto dialed = co_await DialTarget(ex, target.value(), proxy.connect_timeout);
    if (!dialed) {
      Error e = dialed.error();
      e.code = ErrorCode::kProtocol;  // 502: the proxy could not reach the target
      co_return co_await RefuseConnect(req, e);
    }
    metrics_.CountRequest("connect", 200);
    if (!co_await WriteRaw("HTTP/1.1 200 Connection established\r\n\r\n")) co_return;
    std::string early = beast::buffers_to_string(buffer.data());
    tcp::socket client = Lowest().release_socket();
    auto moved = co_await Splice(std::move(client), std::move(dialed.value()), std::move(early),
                                 proxy.tunnel_idle_timeout);
    spdlog::debug("tunnel to {} closed: {} bytes up, {} down", std::string(req.target()),
                  moved.first, moved.second);
  }

  // Terminates TLS for a registry in the upstream map with a node-CA leaf for the host, then
  // serves the requests inside as that registry.
  awaitable<void> Terminate(const Request& req, const ConnectTarget& target,
                            const std::string& registry, beast::flat_buffer& buffer) {
    const ProxyOptions& proxy = *env_.proxy;
    auto context = proxy.tls_context(target.host);
    if (!context) {
      spdlog::error("no TLS certificate for CONNECT {}: {}", target.host,
                    context.error().ToString());
      Error e = context.error();
      e.code = ErrorCode::kProtocol;
      co_return co_await RefuseConnect(req, e);
    }
    metrics_.CountConnect("terminate");
    metrics_.CountRequest("connect", 200);
    if (!co_await WriteRaw("HTTP/1.1 200 Connection established\r\n\r\n")) co_return;
    std::shared_ptr<asio::ssl::context> ctx = context.value();  // outlives the TLS stream
    TlsStream tls(std::move(stream_), *ctx);
    beast::error_code ec;
    beast::get_lowest_layer(tls).expires_after(proxy.connect_timeout);
    auto early = buffer.data();
    co_await tls.async_handshake(asio::ssl::stream_base::server, early,
                                 asio::redirect_error(use_awaitable, ec));
    beast::get_lowest_layer(tls).expires_never();
    if (ec) {
      metrics_.proxy_handshake_failures.Increment();
      spdlog::warn(
          "TLS handshake for CONNECT {} failed: {} (does the client trust the proxy "
          "CA? /shoal/v1/proxy/ca.crt)",
          target.host, ec.message());
      co_return;
    }
    buffer.consume(buffer.size());
    spdlog::debug("CONNECT {}: serving registry {} over TLS", std::string(req.target()), registry);
    Connection<TlsStream> inner(std::move(tls), env_, registry);
    co_await inner.Run();
  }

  // Ends the connection mid-response; reason labels shoal_shim_aborted_responses_total.
  bool Abort(std::string_view reason) {
    metrics_.CountAborted(reason);
    beast::error_code ec;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ec);
    Lowest().socket().close(ec);
    return false;
  }

  Stream stream_;
  Backend& backend_;
  Metrics& metrics_;
  const ServerOptions& options_;
  const ServerEnv& env_;
  const std::string connect_registry_;  // empty unless inside a terminated CONNECT
};

}  // namespace

Server::Server(asio::io_context& ioc, Backend& backend, Metrics& metrics, ServerOptions options)
    : ioc_(ioc),
      backend_(backend),
      metrics_(metrics),
      options_(std::move(options)),
      acceptor_(ioc) {}

Result<uint16_t> Server::Listen(const std::string& address, uint16_t port) {
  beast::error_code ec;
  auto addr = asio::ip::make_address(address, ec);
  if (ec)
    return shoal::MakeError(ErrorCode::kInvalidArgument,
                            "listen address " + address + ": " + ec.message());
  tcp::endpoint ep(addr, port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return shoal::MakeError(
        ErrorCode::kIo, "listen on " + address + ":" + std::to_string(port) + ": " + ec.message());
  }
  return acceptor_.local_endpoint().port();
}

void Server::Start() { asio::co_spawn(ioc_, AcceptLoop(), asio::detached); }

void Server::Stop() {
  beast::error_code ec;
  acceptor_.close(ec);
}

awaitable<void> Server::AcceptLoop() {
  for (;;) {
    beast::error_code ec;
    tcp::socket socket = co_await acceptor_.async_accept(asio::redirect_error(use_awaitable, ec));
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
    if (ec) {
      spdlog::warn("accept failed: {}", ec.message());
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    asio::co_spawn(ioc_, Session(std::move(socket)), asio::detached);
  }
}

awaitable<void> Server::Session(tcp::socket socket) {
  ++active_;
  const ServerEnv env{backend_, metrics_, options_, metrics_text_, admin_, proxy_.get()};
  Connection<PlainStream> conn(PlainStream(std::move(socket)), env);
  try {
    co_await conn.Run();
  } catch (const std::exception& e) {
    spdlog::error("connection failed: {}", e.what());
  }
  --active_;
}

}  // namespace shoal::shim
