#include "tracker/manifests/manifest_api.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "lib/core/base64.h"
#include "lib/core/sha256.h"
#include "lib/oci/quote.h"
#include "tracker/swarms/announce.h"

namespace shoal::tracker {
namespace http = boost::beast::http;
using nlohmann::json;

namespace {

constexpr std::string_view kPrefix = "/v1/manifests";
constexpr size_t kMaxAgentBytes = 128;
constexpr size_t kMaxNameBytes = 1024;  // registry host or repository path
constexpr size_t kMaxReferenceBytes = 128 + 7;

enum class Route { kResolve, kPublish, kRelease, kGet, kUnknown };

std::string_view RouteName(Route route) {
  switch (route) {
    case Route::kResolve:
      return "resolve";
    case Route::kPublish:
      return "publish";
    case Route::kRelease:
      return "release";
    case Route::kGet:
      return "get";
    case Route::kUnknown:
      break;
  }
  return "other";
}

bool Printable(std::string_view s) {
  return std::none_of(s.begin(), s.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

// A tag as the distribution spec defines it: [A-Za-z0-9_][A-Za-z0-9._-]{0,127}.
bool ValidTag(std::string_view tag) {
  if (tag.empty() || tag.size() > 128) return false;
  auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  if (!word(tag[0])) return false;
  return std::all_of(tag.begin(), tag.end(),
                     [&](char c) { return word(c) || c == '.' || c == '-'; });
}

std::optional<uint64_t> ParseWait(std::string_view query) {
  // The only query parameter: wait_ms.
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.substr(0, 8) != "wait_ms=") continue;
    std::string_view v = part.substr(8);
    if (v.empty() || v.size() > 12) return std::nullopt;
    uint64_t out = 0;
    for (char c : v) {
      if (c < '0' || c > '9') return std::nullopt;
      out = out * 10 + static_cast<uint64_t>(c - '0');
    }
    return out;
  }
  return 0;
}

}  // namespace

// A validated request.
struct ManifestApi::Call {
  Route route = Route::kUnknown;
  std::string agent;
  std::string registry;
  std::string repository;
  std::string reference;
  std::optional<Digest> ref_digest;  // the reference, when it is a digest
  std::string key;                   // ManifestCache key of the reference
  std::optional<Digest> digest;      // from the path (publish, get)
  std::string media_type;
  std::string manifest;  // decoded
  std::string missing;   // release: the upstream's 404 text, when the fetch found nothing
  std::string lease_id;  // publish, release: the lease resolve handed out
  std::chrono::milliseconds wait{0};
};

namespace {

struct Rejection {
  unsigned status = 400;
  std::string message;
  std::string_view allow;  // for 405: the methods the path takes
};

std::optional<Rejection> StringField(const json& j, const char* name, bool required, size_t max,
                                     std::string& out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    if (!required) return std::nullopt;
    return Rejection{400, std::string("request body has no \"") + name + "\" field"};
  }
  if (!it->is_string()) return Rejection{400, std::string("\"") + name + "\" must be a string"};
  const auto& s = it->get_ref<const std::string&>();
  if ((required && s.empty()) || s.size() > max || !Printable(s)) {
    return Rejection{400, fmt::format("\"{}\" must be a non-empty string of at most {} printable "
                                      "characters",
                                      name, max)};
  }
  out = s;
  return std::nullopt;
}

template <typename Call>
std::optional<Rejection> ParseReference(const json& j, bool required, Call& call) {
  if (auto r = StringField(j, "agent", true, kMaxAgentBytes, call.agent)) return r;
  if (auto r = StringField(j, "registry", required, kMaxNameBytes, call.registry)) return r;
  if (auto r = StringField(j, "repository", required, kMaxNameBytes, call.repository)) return r;
  if (auto r = StringField(j, "reference", required, kMaxReferenceBytes, call.reference)) return r;
  if (call.reference.empty()) return std::nullopt;
  if (call.registry.empty() || call.repository.empty()) {
    return Rejection{400, "\"reference\" needs \"registry\" and \"repository\""};
  }
  if (call.reference.find(':') != std::string::npos) {
    auto d = Digest::Parse(call.reference);
    if (!d) return Rejection{400, "\"reference\" is not a tag or digest: " + d.error().message};
    call.ref_digest = d.value();
  } else if (!ValidTag(call.reference)) {
    return Rejection{400, "\"reference\" " + oci::Quote(call.reference, 80) +
                              " is not a valid tag ([A-Za-z0-9_][A-Za-z0-9._-]{0,127})"};
  }
  call.key = ManifestCache::ManifestKey(call.registry, call.repository, call.reference,
                                        call.ref_digest.has_value());
  return std::nullopt;
}

template <typename Call>
std::optional<Rejection> ParseRequest(const BlobRequest& req, std::chrono::milliseconds max_wait,
                                      Call& call) {
  std::string_view rest = req.path.substr(std::min(req.path.size(), kPrefix.size()));
  if (rest.size() <= 1 || rest.find('/', 1) != std::string_view::npos) {
    return Rejection{404,
                     "no such manifest API endpoint (want /v1/manifests/resolve, "
                     "/v1/manifests/release or /v1/manifests/{digest})"};
  }
  std::string_view name = rest.substr(1);
  if (name == "resolve" || name == "release") {
    if (req.method != http::verb::post) {
      return Rejection{
          405, std::string(http::to_string(req.method)) + " is not supported; use POST", "POST"};
    }
    call.route = name == "resolve" ? Route::kResolve : Route::kRelease;
  } else {
    auto text = PercentDecode(name, "digest");
    if (!text) return Rejection{400, text.error().message};
    auto d = Digest::Parse(text.value());
    if (!d) return Rejection{400, "bad digest in path: " + d.error().message};
    call.digest = d.value();
    if (req.method == http::verb::get || req.method == http::verb::head) {
      call.route = Route::kGet;
      return std::nullopt;
    }
    if (req.method != http::verb::put) {
      return Rejection{
          405, std::string(http::to_string(req.method)) + " is not supported; use GET, HEAD or PUT",
          "GET, HEAD, PUT"};
    }
    call.route = Route::kPublish;
  }
  if (call.route == Route::kResolve) {
    auto wait = ParseWait(req.query);
    if (!wait) return Rejection{400, "wait_ms is not a non-negative integer"};
    call.wait = std::min(std::chrono::milliseconds(static_cast<int64_t>(*wait)), max_wait);
  }
  if (req.body.empty()) return Rejection{400, "request body is empty; a JSON object is required"};
  json j;
  try {
    j = json::parse(req.body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e999
    return Rejection{400, std::string("request body is not valid JSON: ") + e.what()};
  }
  if (!j.is_object()) return Rejection{400, "request body is not a JSON object"};
  if (auto r = ParseReference(j, call.route != Route::kPublish, call)) return r;
  if (call.route != Route::kResolve) {
    if (auto r = StringField(j, "lease_id", false, 64, call.lease_id)) return r;
  }
  if (call.route == Route::kRelease) return StringField(j, "missing", false, 1024, call.missing);
  if (call.route != Route::kPublish) return std::nullopt;
  if (call.ref_digest && *call.ref_digest != *call.digest) {
    return Rejection{
        400, "\"reference\" " + oci::Quote(call.reference, 80) + " is not the digest in the path"};
  }
  if (auto r = StringField(j, "media_type", true, 256, call.media_type)) return r;
  std::string encoded;
  if (auto r = StringField(j, "manifest", true, 8u << 20, encoded)) return r;
  auto decoded = Base64Decode(encoded);
  if (!decoded || decoded->empty()) {
    return Rejection{400, "\"manifest\" is not non-empty base64 (RFC 4648, with padding)"};
  }
  call.manifest = std::move(*decoded);
  return std::nullopt;
}

// LeaseWaiters is keyed by digest: park resolve requests under a digest of their key.
Digest WaitKey(const std::string& key) { return Sha256::Of("manifest|" + key); }

}  // namespace

ManifestApi::ManifestApi(ManifestApiOptions options, prometheus::Registry& registry,
                         std::string tracker_id, uint64_t seed)
    : options_(std::move(options)),
      tracker_id_(std::move(tracker_id)),
      cache_(options_.cache, seed),
      requests_(prometheus::BuildCounter()
                    .Name("shoal_tracker_manifest_api_requests_total")
                    .Help("Manifest API requests, by route and status")
                    .Register(registry)),
      hits_(prometheus::BuildCounter()
                .Name("shoal_tracker_manifest_hits_total")
                .Help("Manifest resolutions answered from the cluster-wide cache")
                .Register(registry)
                .Add({})),
      misses_(
          prometheus::BuildCounter()
              .Name("shoal_tracker_manifest_misses_total")
              .Help("Manifest resolutions answered with a fetch lease (one agent goes upstream)")
              .Register(registry)
              .Add({})),
      lease_waits_(prometheus::BuildCounter()
                       .Name("shoal_tracker_manifest_lease_waits_total")
                       .Help("Manifest resolutions that waited for another agent's fetch")
                       .Register(registry)
                       .Add({})),
      missing_hits_(prometheus::BuildCounter()
                        .Name("shoal_tracker_manifest_missing_hits_total")
                        .Help("Manifest resolutions answered \"not found\" from an agent's recent "
                              "upstream 404, without asking upstream again")
                        .Register(registry)
                        .Add({})),
      missing_reports_(prometheus::BuildCounter()
                           .Name("shoal_tracker_manifest_missing_reports_total")
                           .Help("Upstream 404s for manifests reported by agents (remembered "
                                 "for --manifest-missing-ttl-s)")
                           .Register(registry)
                           .Add({})),
      leases_expired_(prometheus::BuildCounter()
                          .Name("shoal_tracker_manifest_leases_expired_total")
                          .Help("Manifest fetch leases that expired without a publish")
                          .Register(registry)
                          .Add({})),
      published_(prometheus::BuildCounter()
                     .Name("shoal_tracker_manifests_published_total")
                     .Help("Manifests published by agents and stored")
                     .Register(registry)
                     .Add({})),
      rejected_(prometheus::BuildCounter()
                    .Name("shoal_tracker_manifest_publish_rejected_total")
                    .Help("Manifest publications refused (digest mismatch, too large, invalid)")
                    .Register(registry)
                    .Add({})),
      not_holder_(prometheus::BuildCounter()
                      .Name("shoal_tracker_manifest_publishes_refused_total")
                      .Help("Manifest publications refused (403): the publisher did not hold the "
                            "reference's fetch lease")
                      .Register(registry)
                      .Add({})),
      manifests_(prometheus::BuildGauge()
                     .Name("shoal_tracker_manifests")
                     .Help("Manifests in the cluster-wide cache")
                     .Register(registry)
                     .Add({})),
      bytes_(prometheus::BuildGauge()
                 .Name("shoal_tracker_manifest_bytes")
                 .Help("Bytes of manifests in the cluster-wide cache")
                 .Register(registry)
                 .Add({})) {}

bool ManifestApi::Owns(std::string_view path) {
  return path == kPrefix ||
         (path.size() > kPrefix.size() && path.substr(0, kPrefix.size()) == kPrefix &&
          path[kPrefix.size()] == '/');
}

boost::asio::awaitable<BlobResponse> ManifestApi::Handle(BlobRequest req) {
  Call call;
  if (auto rejected = ParseRequest(req, options_.max_wait, call)) {
    BlobResponse response = Error(rejected->status, std::move(rejected->message));
    response.allow = rejected->allow;
    Count(response, RouteName(call.route));
    co_return response;
  }
  if (call.route != Route::kResolve || call.wait.count() == 0) {
    BlobResponse response = Execute(call, TrackerClock::now());
    Count(response, RouteName(call.route));
    co_return response;
  }
  TimePoint deadline = TrackerClock::now() + call.wait;
  const Digest wait_key = WaitKey(call.key);
  bool counted = false;
  for (;;) {
    TimePoint now = TrackerClock::now();
    const Digest* ref = call.ref_digest ? &*call.ref_digest : nullptr;
    ManifestAnswer answer = cache_.Resolve(call.key, ref, call.agent, now);
    bool wait = answer.kind == ManifestAnswer::Kind::kWait;
    if (wait && !counted) {
      lease_waits_.Increment();
      counted = true;
    }
    if (!wait || now >= deadline || stopping_ || waiters_.size() >= options_.max_waiters) {
      BlobResponse response = ResolveResponse(call, answer, now);
      Count(response, RouteName(call.route));
      co_return response;
    }
    TimePoint until = std::min(deadline, answer.recheck_at);
    co_await waiters_.Wait(wait_key, false, until);
  }
}

BlobResponse ManifestApi::HandleNow(const BlobRequest& req, TimePoint now) {
  Call call;
  BlobResponse response;
  if (auto rejected = ParseRequest(req, options_.max_wait, call)) {
    response = Error(rejected->status, std::move(rejected->message));
    response.allow = rejected->allow;
  } else {
    response = Execute(call, now);
  }
  Count(response, RouteName(call.route));
  return response;
}

BlobResponse ManifestApi::Execute(const Call& call, TimePoint now) {
  switch (call.route) {
    case Route::kResolve: {
      const Digest* ref = call.ref_digest ? &*call.ref_digest : nullptr;
      return ResolveResponse(call, cache_.Resolve(call.key, ref, call.agent, now), now);
    }
    case Route::kPublish: {
      const bool is_tag = !call.reference.empty() && !call.ref_digest;
      PublishErrc err = cache_.Publish(*call.digest, call.media_type, call.manifest, call.key,
                                       is_tag, call.agent, call.lease_id, now);
      if (err == PublishErrc::kNotLeaseHolder) {
        not_holder_.Increment();
        spdlog::warn("agent {} published {} for {} without holding its fetch lease; refused",
                     call.agent, call.digest->str(), call.key.empty() ? "no reference" : call.key);
        return Error(403, "only the agent holding the fetch lease on " +
                              (call.key.empty() ? std::string("a reference") : call.key) +
                              " may publish it (resolve it first)");
      }
      if (err != PublishErrc::kOk) {
        rejected_.Increment();
        if (err == PublishErrc::kDigestMismatch) {
          spdlog::warn("agent {} published manifest bytes that are not {}; refused", call.agent,
                       call.digest->str());
          return Error(400, "manifest bytes do not hash to " + call.digest->str());
        }
        if (err == PublishErrc::kTooLarge) {
          return Error(413, fmt::format("manifest is larger than {} bytes",
                                        cache_.options().max_manifest_bytes));
        }
        return Error(400, "manifest or media type is empty or too long");
      }
      published_.Increment();
      if (!call.key.empty()) waiters_.WakeBlob(WaitKey(call.key));
      ManifestTotals t = cache_.totals();
      manifests_.Set(static_cast<double>(t.manifests));
      bytes_.Set(static_cast<double>(t.bytes));
      return Json(200, json{{"digest", call.digest->str()}});
    }
    case Route::kRelease: {
      if (!call.missing.empty()) {
        bool dropped =
            cache_.ReleaseMissing(call.key, call.agent, call.lease_id, call.missing, now);
        if (!dropped) return Json(200, json{{"released", false}, {"missing", false}});
        missing_reports_.Increment();
        spdlog::info(
            "manifest {}: agent {} found nothing upstream ({}); answering that for {} s", call.key,
            call.agent, call.missing,
            std::chrono::duration_cast<std::chrono::seconds>(cache_.options().missing_ttl).count());
        waiters_.WakeBlob(WaitKey(call.key));
        return Json(200, json{{"released", dropped}, {"missing", true}});
      }
      bool dropped = cache_.Release(call.key, call.agent, call.lease_id);
      if (dropped) waiters_.WakeBlob(WaitKey(call.key));
      return Json(200, json{{"released", dropped}});
    }
    case Route::kGet: {
      auto found = cache_.Find(*call.digest);
      if (!found) return Error(404, "manifest " + call.digest->str() + " is not cached");
      return Json(200, json{{"digest", found->digest.str()},
                            {"media_type", found->media_type},
                            {"manifest", Base64Encode(found->body)}});
    }
    case Route::kUnknown:
      break;
  }
  return Error(404, "no such manifest API endpoint");
}

BlobResponse ManifestApi::ResolveResponse(const Call& call, const ManifestAnswer& a,
                                          TimePoint now) {
  switch (a.kind) {
    case ManifestAnswer::Kind::kFound:
      hits_.Increment();
      return Json(200, json{{"state", "found"},
                            {"digest", a.manifest->digest.str()},
                            {"media_type", a.manifest->media_type},
                            {"manifest", Base64Encode(a.manifest->body)},
                            {"age_ms", a.age.count()}});
    case ManifestAnswer::Kind::kFetch:
      misses_.Increment();
      if (a.took_over) {
        leases_expired_.Increment();
        spdlog::info("manifest fetch lease on {} expired; passed to agent {}", call.key,
                     call.agent);
      }
      return Json(200, json{{"state", "fetch"},
                            {"lease_ttl_ms", a.lease_ttl.count()},
                            {"lease_id", a.lease_id}});
    case ManifestAnswer::Kind::kMissing:
      missing_hits_.Increment();
      return Json(200, json{{"state", "missing"}, {"error", a.missing}, {"age_ms", a.age.count()}});
    case ManifestAnswer::Kind::kWait: {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(a.recheck_at - now);
      left = std::clamp(left, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
      return Json(200, json{{"state", "wait"}, {"retry_after_ms", left.count()}});
    }
  }
  return Error(500, "unreachable");
}

BlobResponse ManifestApi::Json(unsigned status, json body) const {
  body["tracker_id"] = tracker_id_;
  BlobResponse response;
  response.status = status;
  response.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return response;
}

BlobResponse ManifestApi::Error(unsigned status, std::string message) const {
  return Json(status, json{{"error", std::move(message)}});
}

void ManifestApi::Count(const BlobResponse& response, std::string_view route) {
  requests_.Add({{"route", std::string(route)}, {"code", std::to_string(response.status)}})
      .Increment();
}

void ManifestApi::Shutdown() {
  stopping_ = true;
  waiters_.WakeAll();
}

void ManifestApi::Sweep(TimePoint now) {
  size_t expired = cache_.Sweep(now);
  if (expired > 0) leases_expired_.Increment(static_cast<double>(expired));
  ManifestTotals t = cache_.totals();
  manifests_.Set(static_cast<double>(t.manifests));
  bytes_.Set(static_cast<double>(t.bytes));
}

std::string ManifestApi::StatusSection() const {
  const ManifestCacheOptions& o = cache_.options();
  ManifestTotals t = cache_.totals();
  return fmt::format(
      "manifests {} (max {}), {} bytes (max {}); tags {} (ttl {} s); fetch leases {} (ttl {} "
      "s); {} resolve requests long-polling\n",
      t.manifests, o.max_manifests, t.bytes, o.max_bytes, t.tags,
      std::chrono::duration<double>(o.tag_ttl).count(), t.leases,
      std::chrono::duration<double>(o.lease_ttl).count(), waiters_.size());
}

}  // namespace shoal::tracker
