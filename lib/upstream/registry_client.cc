#include "lib/upstream/registry_client.h"

#include <utility>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "lib/core/content_hash.h"
#include "lib/http/client.h"
#include "lib/http/range.h"
#include "lib/http/retry_after.h"
#include "lib/upstream/www_authenticate.h"

// GCC 12 takes the recycled coroutine frames of Boost 1.74 (awaitable_frame_base's operator
// new/delete) for a mismatched new/delete pair when it inlines them; they do match.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace shoal::upstream {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using Clock = std::chrono::steady_clock;
using ResponsePtr = std::unique_ptr<http::Response>;

namespace {

constexpr size_t kMaxManifestBytes = 4 << 20;
constexpr size_t kMaxErrorBody = 64 << 10;
constexpr size_t kMaxTokenBody = 1 << 20;
constexpr int kMaxRedirects = 5;
constexpr size_t kMaxCachedTokens = 1024;

bool IsRedirect(unsigned s) { return s == 301 || s == 302 || s == 303 || s == 307 || s == 308; }

bool IsTransient(const Error& e) {
  return e.code == ErrorCode::kUnavailable || e.code == ErrorCode::kTooManyRequests;
}

// Repository names go into the request path, so only the OCI name alphabet is allowed, and no
// empty, "." or ".." segments.
bool IsSafeRepo(std::string_view repo) {
  if (repo.empty() || repo.size() > 255) return false;
  for (char c : repo) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-' || c == '/';
    if (!ok) return false;
  }
  size_t start = 0;
  while (true) {
    size_t slash = repo.find('/', start);
    std::string_view seg = repo.substr(start, slash - start);
    if (seg.empty() || seg == "." || seg == "..") return false;
    if (slash == std::string_view::npos) return true;
    start = slash + 1;
  }
}

// A tag or a digest.
bool IsSafeReference(std::string_view ref) {
  if (ref.empty() || ref.size() > 200 || ref == "." || ref == "..") return false;
  for (char c : ref) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == ':' || c == '+' || c == '=';
    if (!ok) return false;
  }
  return true;
}

// A listing endpoint and its query: "tags/list" or "referrers/<reference>", and query text of
// unreserved characters, "%", "+", "/", ":", "=" and "&".
bool IsSafeListing(std::string_view endpoint, std::string_view query) {
  constexpr std::string_view kReferrers = "referrers/";
  bool endpoint_ok =
      endpoint == "tags/list" ||
      (endpoint.starts_with(kReferrers) && IsSafeReference(endpoint.substr(kReferrers.size())));
  if (!endpoint_ok || query.size() > 2048) return false;
  for (char c : query) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_' || c == '~' || c == '%' || c == '+' || c == '/' ||
              c == ':' || c == '=' || c == '&';
    if (!ok) return false;
  }
  return true;
}

// The first OCI error code of an error body ("NAME_UNKNOWN"), or "" when it has none usable.
std::string UpstreamCode(const std::string& body) {
  auto doc = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return "";
  auto errors = doc.find("errors");
  if (errors == doc.end() || !errors->is_array() || errors->empty()) return "";
  const auto& first = (*errors)[0];
  if (!first.is_object()) return "";
  auto c = first.find("code");
  if (c == first.end() || !c->is_string()) return "";
  std::string code = c->get<std::string>();
  if (code.empty() || code.size() > 64 || !std::all_of(code.begin(), code.end(), [](char ch) {
        return (ch >= 'A' && ch <= 'Z') || ch == '_';
      })) {
    return "";
  }
  return code;
}

// Tokens go into an Authorization header: visible ASCII only.
bool IsSafeToken(std::string_view token) {
  if (token.empty() || token.size() > 64 * 1024) return false;
  for (char c : token) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

std::string Printable(std::string_view s, size_t max) {
  std::string out;
  for (char c : s.substr(0, max)) {
    unsigned char u = static_cast<unsigned char>(c);
    out += (u < 0x20 || u >= 0x7f) ? '?' : c;
  }
  if (s.size() > max) out += "...";
  return out;
}

// "CODE: message" from an OCI error body {"errors":[{"code":..,"message":..}]}, or "".
std::string UpstreamMessage(const std::string& body) {
  if (body.empty()) return "";
  auto doc = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return "";
  auto errors = doc.find("errors");
  if (errors == doc.end() || !errors->is_array() || errors->empty()) return "";
  const auto& first = (*errors)[0];
  if (!first.is_object()) return "";
  std::string out;
  if (auto c = first.find("code"); c != first.end() && c->is_string()) {
    out = c->get<std::string>();
  }
  if (auto m = first.find("message"); m != first.end() && m->is_string()) {
    if (!out.empty()) out += ": ";
    out += m->get<std::string>();
  }
  return Printable(out, 300);
}

// The media type of a Content-Type value: parameters dropped, trimmed, lowercased.
std::string MediaType(std::string_view content_type) {
  std::string_view t = content_type.substr(0, content_type.find(';'));
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
  std::string out(t);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// Maps a non-success answer to an Error; `body` is the (possibly empty) error body.
Error StatusError(const http::Response& resp, const std::string& what, const std::string& body) {
  unsigned s = resp.status();
  std::string detail = UpstreamMessage(body);
  std::string suffix = detail.empty() ? "" : " (" + detail + ")";
  ErrorCode code = ErrorCode::kProtocol;
  std::string msg;
  if (s == 404) {
    code = ErrorCode::kNotFound;
    msg = what + " not found at " + resp.url().Redacted() + suffix;
  } else {
    if (s == 401) code = ErrorCode::kUnauthorized;
    else if (s == 403) code = ErrorCode::kDenied;
    else if (s == 429) code = ErrorCode::kTooManyRequests;
    else if (s == 408 || (s >= 500 && s <= 599)) code = ErrorCode::kUnavailable;
    else if (s == 416) code = ErrorCode::kRangeNotSatisfiable;
    else if (s == 400) code = ErrorCode::kInvalidArgument;
    msg = what + ": " + resp.url().Redacted() + " answered " + std::to_string(s) + suffix;
  }
  Error e = MakeError(code, std::move(msg));
  e.retry_after_s = http::RetryAfterSeconds(resp.header(bhttp::field::retry_after));
  return e;
}

std::string Scope(const std::string& repo) { return "repository:" + repo + ":pull"; }

uint64_t Jitter(uint64_t lo, uint64_t hi) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
}

}  // namespace

// One logical registry request, before auth and redirects.
struct Call {
  bhttp::verb method = bhttp::verb::get;
  std::string target;  // /v2/<repo>/...
  std::string accept;  // Accept header or ""
  std::string range;   // Range header or ""
  std::string scope;   // token scope, repository:<repo>:pull
  std::string what;    // names the object in messages: "manifest repo:tag", "blob repo@digest"
  // An access check (CheckPull): only `auth` is presented (nothing: anonymous), never the
  // client's credentials nor its cached tokens, and tokens fetched for it are not cached.
  bool check_only = false;
  std::optional<BasicAuth> auth;
};

struct RegistryClient::Impl : std::enable_shared_from_this<RegistryClient::Impl> {
  Impl(net::any_io_executor ex, ClientOptions opts, Credentials creds)
      : executor(ex),
        options(std::move(opts)),
        credentials(std::move(creds)),
        http(ex, http::ClientConfig{options.ca_file, options.connect_timeout,
                                    options.idle_timeout}),
        token_strand(net::make_strand(ex)) {
    if (options.max_attempts < 1) options.max_attempts = 1;
  }

  // A token fetch that concurrent callers wait for instead of fetching the same token again.
  struct TokenFetch {
    explicit TokenFetch(net::any_io_executor ex) : done(ex, Clock::time_point::max()) {}
    net::steady_timer done;  // cancelled when `result` is set
    std::optional<Result<std::string>> result;
  };
  struct CachedToken {
    std::string value;
    Clock::time_point refresh_at;
  };

  net::awaitable<Result<ResponsePtr>> Send(const RegistryEndpoint& ep, const Call& call);
  // `addresses` applies to every hop: a registry's redirect targets and token realms are as
  // far from the operator's say as the registry itself.
  net::awaitable<Result<ResponsePtr>> FollowRedirects(http::Url url, bhttp::verb method,
                                                      const bhttp::fields& headers,
                                                      const std::string& authorization,
                                                      http::AddressPolicy addresses);
  net::awaitable<Result<std::string>> GetToken(const RegistryEndpoint& ep,
                                               const std::string& cache_scope,
                                               const Challenge& challenge);
  net::awaitable<std::optional<Result<std::string>>> TokenOnStrand(std::string key,
                                                                   RegistryEndpoint ep,
                                                                   std::string realm,
                                                                   std::string service,
                                                                   std::string scope);
  // check: an access check's call (its credentials, nothing cached), or null.
  net::awaitable<Result<std::string>> FetchToken(const std::string& key, const RegistryEndpoint& ep,
                                                 const std::string& realm,
                                                 const std::string& service,
                                                 const std::string& scope,
                                                 const Call* check = nullptr);
  net::awaitable<Error> ErrorFromResponse(http::Response& resp, const std::string& what);
  net::awaitable<bool> BackoffBeforeRetry(int failures, const Error& e, const std::string& url);
  net::awaitable<Result<ManifestResponse>> Manifest(const RegistryEndpoint& ep,
                                                    const std::string& repo,
                                                    const std::string& reference,
                                                    const std::string& accept, bhttp::verb method);
  net::awaitable<Status> StreamBody(http::Response& resp, const std::string& what,
                                    uint64_t offset, uint64_t length, uint64_t& delivered,
                                    const BodySink& sink, bool& sink_failed);

  std::string TokenKey(const std::string& registry, const std::string& scope) const {
    return Credentials::NormalizeRegistry(registry) + " " + scope;
  }
  // The Authorization value to try first for a request, or "". Sets `*token` to the cached
  // bearer token used, if any.
  std::string CachedAuthorization(const std::string& registry, const std::string& scope,
                                  std::string* token);
  void ForgetToken(const std::string& key, const std::string& value);
  void StoreToken(const std::string& key, std::string value, std::chrono::seconds ttl);
  void LogFailure(const Error& e) const;

  net::any_io_executor executor;
  ClientOptions options;
  const Credentials credentials;
  http::Client http;
  net::strand<net::any_io_executor> token_strand;

  std::mutex mu;
  std::map<std::string, CachedToken> tokens;  // guarded by mu; key: TokenKey
  std::set<std::string> basic_registries;     // guarded by mu; registries that want Basic
  std::map<std::string, std::shared_ptr<TokenFetch>> inflight;  // used on token_strand only

  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> retries{0};
  std::atomic<uint64_t> bytes{0};
};

std::string RegistryClient::Impl::CachedAuthorization(const std::string& registry,
                                                      const std::string& scope,
                                                      std::string* token) {
  std::lock_guard lock(mu);
  auto it = tokens.find(TokenKey(registry, scope));
  if (it != tokens.end() && Clock::now() < it->second.refresh_at) {
    *token = it->second.value;
    return "Bearer " + it->second.value;
  }
  if (basic_registries.count(Credentials::NormalizeRegistry(registry))) {
    if (auto creds = credentials.For(registry)) return BasicAuthHeader(*creds);
  }
  return "";
}

void RegistryClient::Impl::ForgetToken(const std::string& key, const std::string& value) {
  std::lock_guard lock(mu);
  auto it = tokens.find(key);
  if (it != tokens.end() && it->second.value == value) tokens.erase(it);
}

void RegistryClient::Impl::StoreToken(const std::string& key, std::string value,
                                      std::chrono::seconds ttl) {
  // Refresh a little before the server's expiry so that a token never dies in flight.
  auto margin = std::min(ttl / 2, std::max<std::chrono::seconds>(std::chrono::seconds(5), ttl / 10));
  auto now = Clock::now();
  std::lock_guard lock(mu);
  if (tokens.size() >= kMaxCachedTokens) {
    for (auto it = tokens.begin(); it != tokens.end();) {
      it = it->second.refresh_at <= now ? tokens.erase(it) : std::next(it);
    }
    if (tokens.size() >= kMaxCachedTokens) tokens.erase(tokens.begin());
  }
  tokens[key] = CachedToken{std::move(value), now + ttl - margin};
}

void RegistryClient::Impl::LogFailure(const Error& e) const {
  // A refused address is the agent's own choice, not an upstream failure.
  if (e.code == ErrorCode::kNotFound || e.code == ErrorCode::kRefused) {
    spdlog::info("upstream: {}", e.message);
  } else {
    spdlog::error("upstream: {}", e.ToString());
  }
}

net::awaitable<Result<ResponsePtr>> RegistryClient::Impl::FollowRedirects(
    http::Url url, bhttp::verb method, const bhttp::fields& headers,
    const std::string& authorization, http::AddressPolicy addresses) {
  const http::Url origin = url;
  for (int hop = 0;; ++hop) {
    http::Request req{method, url, headers, "", addresses};
    // Credentials go only to the host they were meant for, never to a redirect target.
    if (!authorization.empty() && url.SameOrigin(origin)) {
      req.headers.set(bhttp::field::authorization, authorization);
    }
    ++requests;
    auto r = co_await http.Open(req);
    if (!r) co_return r;
    unsigned status = r.value()->status();
    if (!IsRedirect(status)) co_return r;
    std::string_view location = r.value()->header(bhttp::field::location);
    if (location.empty()) {
      co_return MakeError(ErrorCode::kProtocol,
                          url.Redacted() + " answered " + std::to_string(status) +
                              " without a Location");
    }
    if (hop >= kMaxRedirects) {
      co_return MakeError(ErrorCode::kProtocol, "more than " + std::to_string(kMaxRedirects) +
                                                    " redirects from " + origin.Redacted());
    }
    auto next = url.Resolve(location);
    if (!next) co_return MakeError(ErrorCode::kProtocol, next.error().message);
    co_await r.value()->Drain(kMaxErrorBody);
    if (status == 303 && method != bhttp::verb::head) method = bhttp::verb::get;
    spdlog::debug("upstream: {} redirects to {}", url.Redacted(), next.value().Redacted());
    url = std::move(next).value();
  }
}

net::awaitable<Result<ResponsePtr>> RegistryClient::Impl::Send(const RegistryEndpoint& ep,
                                                               const Call& call) {
  http::Url url = ep.base;
  url.target = call.target;
  bhttp::fields headers;
  headers.set(bhttp::field::user_agent, options.user_agent);
  if (!call.accept.empty()) headers.set(bhttp::field::accept, call.accept);
  if (!call.range.empty()) headers.set(bhttp::field::range, call.range);

  std::string cached_token;
  std::string authorization;
  if (!call.check_only) {
    authorization = CachedAuthorization(ep.name, call.scope, &cached_token);
  } else if (call.auth) {
    std::lock_guard lock(mu);
    if (basic_registries.count(Credentials::NormalizeRegistry(ep.name)))
      authorization = BasicAuthHeader(*call.auth);
  }
  for (int round = 0;; ++round) {
    auto r = co_await FollowRedirects(url, call.method, headers, authorization, ep.addresses);
    if (!r) co_return r;
    http::Response& resp = *r.value();
    // Only the registry itself may ask for credentials, and only once per call.
    if (resp.status() != 401 || round > 0 || !resp.url().SameOrigin(url)) co_return r;
    auto challenges = ParseWwwAuthenticate(resp.header(bhttp::field::www_authenticate));
    if (!challenges) {
      spdlog::warn("upstream: {} sent an unusable challenge: {}", url.Redacted(),
                   challenges.error().message);
      co_return r;
    }
    const Challenge* bearer = nullptr;
    const Challenge* basic = nullptr;
    for (const auto& c : challenges.value()) {
      if (c.scheme == "bearer" && c.params.count("realm") && !bearer) bearer = &c;
      if (c.scheme == "basic" && !basic) basic = &c;
    }
    if (bearer && call.check_only) {
      co_await resp.Drain(kMaxErrorBody);
      auto param = [&](const char* name) -> std::string {
        auto it = bearer->params.find(name);
        return it == bearer->params.end() ? std::string() : it->second;
      };
      std::string scope = param("scope");
      if (scope.empty()) scope = call.scope;
      auto token = co_await FetchToken("", ep, param("realm"), param("service"), scope, &call);
      if (!token) co_return token.error();
      authorization = "Bearer " + token.value();
    } else if (bearer) {
      co_await resp.Drain(kMaxErrorBody);
      if (!cached_token.empty()) ForgetToken(TokenKey(ep.name, call.scope), cached_token);
      auto token = co_await GetToken(ep, call.scope, *bearer);
      if (!token) co_return token.error();
      authorization = "Bearer " + token.value();
    } else if (basic) {
      auto creds = call.check_only ? call.auth : credentials.For(ep.name);
      if (!creds) co_return r;
      std::string value = BasicAuthHeader(*creds);
      if (value == authorization) co_return r;  // these credentials were just refused
      co_await resp.Drain(kMaxErrorBody);
      {
        std::lock_guard lock(mu);
        basic_registries.insert(Credentials::NormalizeRegistry(ep.name));
      }
      authorization = std::move(value);
    } else {
      co_return r;
    }
  }
}

net::awaitable<Result<std::string>> RegistryClient::Impl::GetToken(const RegistryEndpoint& ep,
                                                                   const std::string& cache_scope,
                                                                   const Challenge& challenge) {
  auto param = [&](const char* name) -> std::string {
    auto it = challenge.params.find(name);
    return it == challenge.params.end() ? std::string() : it->second;
  };
  std::string scope = param("scope");
  if (scope.empty()) scope = cache_scope;
  std::optional<Result<std::string>> r = co_await net::co_spawn(
      token_strand,
      shared_from_this()->TokenOnStrand(TokenKey(ep.name, cache_scope), ep, param("realm"),
                                        param("service"), scope),
      net::use_awaitable);
  if (!r) co_return MakeError(ErrorCode::kInternal, "token fetch for " + ep.name + " vanished");
  co_return std::move(*r);
}

net::awaitable<std::optional<Result<std::string>>> RegistryClient::Impl::TokenOnStrand(
    std::string key, RegistryEndpoint ep, std::string realm, std::string service,
    std::string scope) {
  // Runs on token_strand, so `inflight` needs no lock.
  {
    std::lock_guard lock(mu);
    auto it = tokens.find(key);
    if (it != tokens.end() && Clock::now() < it->second.refresh_at) {
      co_return Result<std::string>(it->second.value);
    }
  }
  if (auto it = inflight.find(key); it != inflight.end()) {
    std::shared_ptr<TokenFetch> fetch = it->second;
    boost::system::error_code ec;
    co_await fetch->done.async_wait(net::redirect_error(net::use_awaitable, ec));
    co_return fetch->result;
  }
  auto fetch = std::make_shared<TokenFetch>(token_strand);
  inflight[key] = fetch;
  auto r = co_await FetchToken(key, ep, realm, service, scope);
  fetch->result = r;
  inflight.erase(key);
  fetch->done.cancel();
  co_return r;
}

net::awaitable<Result<std::string>> RegistryClient::Impl::FetchToken(const std::string& key,
                                                                     const RegistryEndpoint& ep,
                                                                     const std::string& realm,
                                                                     const std::string& service,
                                                                     const std::string& scope,
                                                                     const Call* check) {
  auto url = http::Url::Parse(realm);
  if (!url) {
    co_return MakeError(
        ErrorCode::kProtocol,
        "registry " + ep.name + " named an unusable token realm: " + url.error().message);
  }
  http::Url token_url = std::move(url).value();
  std::string query;
  if (!service.empty()) query += "service=" + http::QueryEscape(service);
  if (!scope.empty()) query += std::string(query.empty() ? "" : "&") + "scope=" + http::QueryEscape(scope);
  if (!query.empty()) {
    token_url.target += (token_url.target.find('?') == std::string::npos ? "?" : "&") + query;
  }
  bhttp::fields headers;
  headers.set(bhttp::field::user_agent, options.user_agent);
  std::string authorization;
  if (check) {
    if (check->auth) authorization = BasicAuthHeader(*check->auth);
  } else if (auto creds = credentials.For(ep.name)) {
    authorization = BasicAuthHeader(*creds);
  }
  const std::string what = "token for " + ep.name + " scope " + Printable(scope, 200);

  auto r =
      co_await FollowRedirects(token_url, bhttp::verb::get, headers, authorization, ep.addresses);
  if (!r) co_return r.error();
  http::Response& resp = *r.value();
  if (resp.status() == 401 || resp.status() == 403) {
    co_await resp.Drain(kMaxErrorBody);
    co_return MakeError(ErrorCode::kUnauthorized,
                        "token server " + token_url.Redacted() + " refused the " + what + " (" +
                            std::to_string(resp.status()) +
                            (authorization.empty() ? ", anonymous)" : ", with credentials)"));
  }
  if (resp.status() != 200) co_return co_await ErrorFromResponse(resp, what);
  auto body = co_await resp.ReadAll(kMaxTokenBody);
  if (!body) co_return body.error();
  auto doc = nlohmann::json::parse(body.value(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](std::string_view why) {
    return MakeError(ErrorCode::kProtocol,
                     "token server " + token_url.Redacted() + " sent an unusable " + what + ": " +
                         std::string(why));
  };
  if (doc.is_discarded() || !doc.is_object()) co_return bad("not a JSON object");
  std::string token;
  for (const char* field : {"token", "access_token"}) {
    auto it = doc.find(field);
    if (it != doc.end() && it->is_string() && !it->get<std::string>().empty()) {
      token = it->get<std::string>();
      break;
    }
  }
  if (token.empty()) co_return bad("no token or access_token");
  if (!IsSafeToken(token)) co_return bad("the token has characters not allowed in a header");
  int64_t expires_in = 60;
  if (auto it = doc.find("expires_in"); it != doc.end() && it->is_number()) {
    expires_in = std::clamp<int64_t>(it->get<int64_t>(), 0, 7 * 24 * 3600);
    if (expires_in == 0) expires_in = 60;
  }
  if (!check) StoreToken(key, token, std::chrono::seconds(expires_in));
  co_return token;
}

net::awaitable<Error> RegistryClient::Impl::ErrorFromResponse(http::Response& resp,
                                                              const std::string& what) {
  std::string body;
  auto read = co_await resp.ReadAll(kMaxErrorBody);
  if (read) body = std::move(read).value();
  co_return StatusError(resp, what, body);
}

net::awaitable<bool> RegistryClient::Impl::BackoffBeforeRetry(int failures, const Error& e,
                                                              const std::string& url) {
  if (!IsTransient(e) || failures >= options.max_attempts) co_return false;
  uint64_t base = static_cast<uint64_t>(options.initial_backoff.count());
  uint64_t cap = static_cast<uint64_t>(std::max<int64_t>(options.max_backoff.count(), 0));
  uint64_t delay = base << std::min(failures - 1, 20);
  delay = std::min(delay, cap);
  delay = Jitter(delay / 2, delay);
  if (e.retry_after_s > 0) {
    delay = std::max<uint64_t>(delay, std::min<uint64_t>(uint64_t(e.retry_after_s) * 1000, cap));
  }
  ++retries;
  spdlog::warn("upstream: attempt {}/{} for {} failed ({}); retrying in {} ms", failures,
               options.max_attempts, url, e.ToString(), delay);
  net::steady_timer timer(co_await net::this_coro::executor, std::chrono::milliseconds(delay));
  boost::system::error_code ec;
  co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
  co_return true;
}

net::awaitable<Result<ManifestResponse>> RegistryClient::Impl::Manifest(
    const RegistryEndpoint& ep, const std::string& repo, const std::string& reference,
    const std::string& accept, bhttp::verb method) {
  if (!IsSafeRepo(repo) || !IsSafeReference(reference)) {
    co_return MakeError(ErrorCode::kInvalidArgument,
                        "invalid repository or reference \"" + Printable(repo, 256) + "\":\"" +
                            Printable(reference, 200) + "\"");
  }
  std::optional<Digest> ref_digest;
  if (reference.find(':') != std::string::npos) {
    auto d = Digest::Parse(reference);
    if (!d) co_return d.error();
    ref_digest = d.value();
  }
  Call call;
  call.method = method;
  call.target = "/v2/" + repo + "/manifests/" + reference;
  call.accept = accept;
  call.scope = Scope(repo);
  call.what = "manifest " + repo + (ref_digest ? "@" : ":") + reference;
  http::Url url = ep.base;
  url.target = call.target;
  const std::string url_text = url.Redacted();

  for (int failures = 1;; ++failures) {
    Error err;
    auto r = co_await Send(ep, call);
    if (!r) {
      err = r.error();
    } else if (r.value()->status() != 200) {
      err = co_await ErrorFromResponse(*r.value(), call.what);
    } else {
      http::Response& resp = *r.value();
      std::string media_type = MediaType(resp.header(bhttp::field::content_type));
      std::string_view header_digest = resp.header("Docker-Content-Digest");
      std::optional<Digest> claimed;
      if (!header_digest.empty()) {
        auto d = Digest::Parse(header_digest);
        if (d) claimed = d.value();
      }
      if (method == bhttp::verb::head) {
        std::optional<Digest> digest = ref_digest ? ref_digest : claimed;
        if (!digest) {
          err = MakeError(ErrorCode::kProtocol, call.what + ": " + url_text +
                                                    " sent no usable Docker-Content-Digest");
        } else if (ref_digest && claimed && claimed->algorithm() == ref_digest->algorithm() &&
                   *claimed != *ref_digest) {
          err = MakeError(ErrorCode::kDigestMismatch,
                          call.what + ": " + url_text + " claims digest " + claimed->str());
        } else {
          co_return ManifestResponse{"", std::move(media_type), *digest};
        }
      } else {
        auto body = co_await resp.ReadAll(kMaxManifestBytes);
        if (!body) {
          err = body.error();
          err.message = call.what + ": " + err.message;
        } else {
          // Hashed in the algorithm of the digest asked for (sha256 for a tag).
          Digest digest = ContentHash::Of(
              ref_digest ? ref_digest->algorithm() : DigestAlgorithm::kSha256, body.value());
          if (ref_digest && digest != *ref_digest) {
            err = MakeError(ErrorCode::kDigestMismatch, call.what + ": body from " + url_text +
                                                            " hashes to " + digest.str());
          } else if (claimed && !ContentHash::Matches(*claimed, body.value())) {
            err = MakeError(ErrorCode::kDigestMismatch,
                            call.what + ": Docker-Content-Digest " + claimed->str() + " from " +
                                url_text + " but the body hashes to " + digest.str());
          } else {
            co_return ManifestResponse{std::move(body).value(), std::move(media_type), digest};
          }
        }
      }
    }
    bool again = co_await BackoffBeforeRetry(failures, err, url_text);
    if (again) continue;
    LogFailure(err);
    co_return err;
  }
}

net::awaitable<Status> RegistryClient::Impl::StreamBody(http::Response& resp,
                                                        const std::string& what, uint64_t offset,
                                                        uint64_t length, uint64_t& delivered,
                                                        const BodySink& sink, bool& sink_failed) {
  const uint64_t start = offset + delivered;
  const uint64_t last = offset + length - 1;
  const std::string url = resp.url().Redacted();
  uint64_t skip = 0;
  if (resp.status() == 206) {
    auto cr = http::ParseContentRange(resp.header(bhttp::field::content_range));
    if (!cr) co_return MakeError(ErrorCode::kProtocol, what + ": " + url + ": " + cr.error().message);
    if (cr.value().range.first != start || cr.value().range.last > last) {
      co_return MakeError(ErrorCode::kProtocol,
                          what + ": " + url + " answered Content-Range " +
                              http::ContentRange(cr.value().range, cr.value().size.value_or(0)) +
                              " for bytes=" + std::to_string(start) + "-" + std::to_string(last));
    }
  } else {
    // A 200 carries the whole blob: usable only when the caller asked for all of it.
    auto cl = resp.content_length();
    if (offset != 0 || (cl && *cl != length)) {
      co_return MakeError(ErrorCode::kProtocol,
                          what + ": " + url + " ignored the Range header (200 with " +
                              (cl ? std::to_string(*cl) : std::string("unknown")) +
                              " bytes for bytes=" + std::to_string(start) + "-" +
                              std::to_string(last) + ")");
    }
    skip = delivered;
  }
  while (true) {
    auto piece = co_await resp.ReadSome();
    if (!piece) co_return MakeError(piece.error().code, what + ": " + piece.error().message);
    std::string_view data = piece.value();
    if (data.empty()) break;
    if (skip > 0) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(skip, data.size()));
      data.remove_prefix(n);
      skip -= n;
      if (data.empty()) continue;
    }
    if (data.size() > length - delivered) {
      co_return MakeError(ErrorCode::kProtocol,
                          what + ": " + url + " sent more than the " + std::to_string(length) +
                              " bytes asked for");
    }
    Status st = sink(data.data(), data.size());
    if (!st) {
      sink_failed = true;
      co_return st;
    }
    delivered += data.size();
    bytes += data.size();
  }
  if (delivered < length) {
    co_return MakeError(ErrorCode::kUnavailable,
                        what + ": " + url + " ended the body after " + std::to_string(delivered) +
                            " of " + std::to_string(length) + " bytes");
  }
  co_return Ok();
}

RegistryClient::RegistryClient(net::any_io_executor executor, ClientOptions options,
                               Credentials credentials)
    : impl_(std::make_shared<Impl>(std::move(executor), std::move(options),
                                   std::move(credentials))) {}

RegistryClient::~RegistryClient() = default;

net::awaitable<Result<ManifestResponse>> RegistryClient::GetManifest(
    const RegistryEndpoint& registry, const std::string& repo, const std::string& reference,
    const std::string& accept) {
  std::shared_ptr<Impl> impl = impl_;
  co_return co_await impl->Manifest(registry, repo, reference, accept, bhttp::verb::get);
}

net::awaitable<Result<ManifestResponse>> RegistryClient::HeadManifest(
    const RegistryEndpoint& registry, const std::string& repo, const std::string& reference,
    const std::string& accept) {
  std::shared_ptr<Impl> impl = impl_;
  co_return co_await impl->Manifest(registry, repo, reference, accept, bhttp::verb::head);
}

net::awaitable<Result<uint64_t>> RegistryClient::StatBlob(const RegistryEndpoint& registry,
                                                          const std::string& repo,
                                                          const Digest& digest) {
  std::shared_ptr<Impl> impl = impl_;
  if (!IsSafeRepo(repo)) {
    co_return MakeError(ErrorCode::kInvalidArgument,
                        "invalid repository \"" + Printable(repo, 256) + "\"");
  }
  Call call;
  call.method = bhttp::verb::head;
  call.target = "/v2/" + repo + "/blobs/" + digest.str();
  call.scope = Scope(repo);
  call.what = "blob " + repo + "@" + digest.str();
  http::Url url = registry.base;
  url.target = call.target;
  const std::string url_text = url.Redacted();
  for (int failures = 1;; ++failures) {
    Error err;
    auto r = co_await impl->Send(registry, call);
    if (!r) {
      err = r.error();
    } else if (r.value()->status() != 200) {
      err = co_await impl->ErrorFromResponse(*r.value(), call.what);
    } else {
      http::Response& resp = *r.value();
      auto size = resp.content_length();
      // A registry may name the blob by another algorithm's digest (docker-registry answers a
      // sha512 request with the content's sha256): only a digest of the same algorithm can
      // contradict the one asked for. The bytes are verified by the fetch in any case.
      std::string_view claimed = resp.header("Docker-Content-Digest");
      auto claimed_digest = Digest::Parse(claimed);
      if (!size) {
        err = MakeError(ErrorCode::kProtocol,
                        call.what + ": " + resp.url().Redacted() + " sent no Content-Length");
      } else if (!claimed.empty() &&
                 (!claimed_digest || claimed_digest.value().algorithm() == digest.algorithm()) &&
                 claimed != digest.str()) {
        err = MakeError(ErrorCode::kDigestMismatch, call.what + ": " + resp.url().Redacted() +
                                                        " claims digest " +
                                                        Printable(claimed, 100));
      } else {
        co_return *size;
      }
    }
    bool again = co_await impl->BackoffBeforeRetry(failures, err, url_text);
    if (again) continue;
    impl->LogFailure(err);
    co_return err;
  }
}

net::awaitable<Status> RegistryClient::FetchBlob(const RegistryEndpoint& registry,
                                                 const std::string& repo, const Digest& digest,
                                                 uint64_t offset, uint64_t length,
                                                 BodySink sink) {
  std::shared_ptr<Impl> impl = impl_;
  if (!IsSafeRepo(repo)) {
    co_return MakeError(ErrorCode::kInvalidArgument,
                        "invalid repository \"" + Printable(repo, 256) + "\"");
  }
  if (length == 0) co_return Ok();
  if (length - 1 > std::numeric_limits<uint64_t>::max() - offset) {
    co_return MakeError(ErrorCode::kInvalidArgument,
                        "blob range offset " + std::to_string(offset) + " length " +
                            std::to_string(length) + " overflows");
  }
  Call call;
  call.method = bhttp::verb::get;
  call.target = "/v2/" + repo + "/blobs/" + digest.str();
  call.scope = Scope(repo);
  call.what = "blob " + repo + "@" + digest.str();
  http::Url url = registry.base;
  url.target = call.target;
  const std::string url_text = url.Redacted();
  uint64_t delivered = 0;
  for (int failures = 1;; ++failures) {
    call.range = "bytes=" + std::to_string(offset + delivered) + "-" +
                 std::to_string(offset + length - 1);
    Error err;
    auto r = co_await impl->Send(registry, call);
    if (!r) {
      err = r.error();
    } else if (r.value()->status() != 206 && r.value()->status() != 200) {
      err = co_await impl->ErrorFromResponse(*r.value(), call.what);
    } else {
      bool sink_failed = false;
      Status st = co_await impl->StreamBody(*r.value(), call.what, offset, length, delivered,
                                            sink, sink_failed);
      if (st) co_return Ok();
      if (sink_failed) co_return st;
      err = st.error();
    }
    bool again = co_await impl->BackoffBeforeRetry(failures, err, url_text);
    if (again) continue;
    impl->LogFailure(err);
    co_return err;
  }
}

net::awaitable<Result<ListingResponse>> RegistryClient::GetListing(const RegistryEndpoint& registry,
                                                                   const std::string& repo,
                                                                   const std::string& endpoint,
                                                                   const std::string& query,
                                                                   const std::string& accept) {
  std::shared_ptr<Impl> impl = impl_;
  if (!IsSafeRepo(repo) || !IsSafeListing(endpoint, query)) {
    co_return MakeError(ErrorCode::kInvalidArgument,
                        "invalid repository, endpoint or query \"" + Printable(repo, 256) + "/" +
                            Printable(endpoint, 200) + "?" + Printable(query, 200) + "\"");
  }
  Call call;
  call.method = bhttp::verb::get;
  call.target = "/v2/" + repo + "/" + endpoint + (query.empty() ? "" : "?" + query);
  call.accept = accept;
  call.scope = Scope(repo);
  call.what = endpoint.substr(0, endpoint.find('/')) + " of " + repo;
  http::Url url = registry.base;
  url.target = call.target;
  const std::string url_text = url.Redacted();
  for (int failures = 1;; ++failures) {
    Error err;
    auto r = co_await impl->Send(registry, call);
    if (!r) {
      err = r.error();
    } else if (r.value()->status() == 404) {
      ListingResponse out;
      out.status = 404;
      auto body = co_await r.value()->ReadAll(kMaxErrorBody);
      if (body) out.error_code = UpstreamCode(body.value());
      spdlog::info("upstream: {} not found at {} ({})", call.what, url_text,
                   out.error_code.empty() ? "no OCI error code" : out.error_code);
      co_return out;
    } else if (r.value()->status() != 200) {
      err = co_await impl->ErrorFromResponse(*r.value(), call.what);
    } else {
      http::Response& resp = *r.value();
      auto body = co_await resp.ReadAll(kMaxManifestBytes);
      if (!body) {
        err = body.error();
        err.message = call.what + ": " + err.message;
      } else {
        ListingResponse out;
        out.body = std::move(body).value();
        out.content_type = std::string(resp.header(bhttp::field::content_type));
        out.link = std::string(resp.header(bhttp::field::link));
        out.filters_applied = std::string(resp.header("OCI-Filters-Applied"));
        co_return out;
      }
    }
    bool again = co_await impl->BackoffBeforeRetry(failures, err, url_text);
    if (again) continue;
    impl->LogFailure(err);
    co_return err;
  }
}

net::awaitable<Result<Access>> RegistryClient::CheckPull(const RegistryEndpoint& registry,
                                                         const std::string& repo,
                                                         const PullProbe& probe,
                                                         const std::optional<BasicAuth>& auth) {
  std::shared_ptr<Impl> impl = impl_;
  const bool tags = probe.kind == PullProbe::Kind::kTags;
  if (!IsSafeRepo(repo) || (!tags && !IsSafeReference(probe.reference))) {
    co_return MakeError(ErrorCode::kInvalidArgument,
                        "invalid repository or reference \"" + Printable(repo, 256) + "\":\"" +
                            Printable(probe.reference, 200) + "\"");
  }
  Call call;
  call.method = tags ? bhttp::verb::get : bhttp::verb::head;
  switch (probe.kind) {
    case PullProbe::Kind::kManifest:
      call.target = "/v2/" + repo + "/manifests/" + probe.reference;
      call.accept = "application/vnd.oci.image.index.v1+json,"
                    "application/vnd.oci.image.manifest.v1+json,"
                    "application/vnd.docker.distribution.manifest.list.v2+json,"
                    "application/vnd.docker.distribution.manifest.v2+json";
      break;
    case PullProbe::Kind::kBlob:
      call.target = "/v2/" + repo + "/blobs/" + probe.reference;
      break;
    case PullProbe::Kind::kTags:
      call.target = "/v2/" + repo + "/tags/list?n=1";
      call.accept = "application/json";
      break;
  }
  call.scope = Scope(repo);
  call.what = "access check of " + repo + (tags ? " tags" : " " + Printable(probe.reference, 200)) +
              (auth ? " with a client's credentials" : " (anonymous)");
  call.check_only = true;
  call.auth = auth;
  http::Url url = registry.base;
  url.target = call.target;
  const std::string url_text = url.Redacted();
  for (int failures = 1;; ++failures) {
    Error err;
    auto r = co_await impl->Send(registry, call);
    if (!r) {
      err = r.error();
    } else {
      unsigned status = r.value()->status();
      co_await r.value()->Drain(kMaxErrorBody);
      if (status == 200) co_return Access::kGranted;
      if (status == 401 || status == 403) co_return Access::kRefused;
      if (status == 404) co_return Access::kMissing;
      err = StatusError(*r.value(), call.what, "");
    }
    // A token server that refuses these credentials has answered the question.
    if (err.code == ErrorCode::kUnauthorized || err.code == ErrorCode::kDenied)
      co_return Access::kRefused;
    bool again = co_await impl->BackoffBeforeRetry(failures, err, url_text);
    if (again) continue;
    impl->LogFailure(err);
    co_return err;
  }
}

RegistryClient::Stats RegistryClient::stats() const {
  return Stats{impl_->requests.load(), impl_->retries.load(), impl_->bytes.load()};
}

}  // namespace shoal::upstream
