#include "tracker/blobs/blob_api.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "lib/core/base64.h"
#include "lib/oci/quote.h"
#include "tracker/swarms/announce.h"
#include "tracker/request_checks.h"

namespace shoal::tracker {
namespace http = boost::beast::http;
using nlohmann::json;

// The blob API's endpoints (at namespace scope: BlobCall, declared in the header, holds one).
enum class BlobRoute {
  kCreate, kGet, kLease, kWork, kReady, kRelease, kRenew, kPublish, kBad, kUnknown
};

namespace {

constexpr std::string_view kPrefix = "/v1/blobs";
constexpr size_t kMaxAgentBytes = 128;
constexpr size_t kMaxLeaseIdBytes = 128;
constexpr size_t kMaxSourceBytes = 1024;  // registry host or repository path
constexpr size_t kStatusPageLeases = 50;
// Chunks one ready poll may wait on (an agent asks for its window, a few chunks).
constexpr size_t kMaxReadyChunks = 64;

std::string_view RouteName(BlobRoute route) {
  switch (route) {
    case BlobRoute::kCreate:
      return "create_blob";
    case BlobRoute::kGet:
      return "get_blob";
    case BlobRoute::kLease:
      return "lease";
    case BlobRoute::kWork:
      return "work";
    case BlobRoute::kReady:
      return "ready";
    case BlobRoute::kRelease:
      return "release";
    case BlobRoute::kRenew:
      return "renew";
    case BlobRoute::kPublish:
      return "publish";
    case BlobRoute::kBad:
      return "bad";
    case BlobRoute::kUnknown:
      return "other";
  }
  return "other";
}

std::optional<swarm::Sha1> ParseInfoHash(std::string_view hex) {
  if (hex.size() != 40) return std::nullopt;
  swarm::Sha1 out{};
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = value(hex[2 * i]);
    int lo = value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return out;
}

unsigned StatusOf(BlobErrc code) {
  switch (code) {
    case BlobErrc::kInvalid:
      return 400;
    case BlobErrc::kNotFound:
      return 404;
    case BlobErrc::kConflict:
      return 409;
    case BlobErrc::kFull:
      return 503;
    case BlobErrc::kForbidden:
      return 403;
  }
  return 400;
}

void AddLayout(json& j, const swarm::ChunkLayout& layout) {
  j["size"] = layout.blob_size;
  j["chunk_size"] = layout.chunk_size;
  j["piece_size"] = layout.piece_size;
  j["first_chunk_size"] = layout.first_chunk_size;
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes >= (1ull << 30))
    return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1 << 30));
  if (bytes >= (1ull << 20))
    return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= (1ull << 10))
    return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / (1 << 10));
  return fmt::format("{} B", bytes);
}

}  // namespace

// A validated request, ready for the table.
struct BlobCall {
  BlobRoute route = BlobRoute::kUnknown;
  Digest digest = Digest::FromSha256Hex(std::string(64, '0'));
  uint32_t k = 0;
  std::string agent;
  std::string lease_id;
  BlobSource source;
  std::string metainfo;  // decoded
  swarm::Sha1 info_hash{};
  uint64_t bytes = 0;
  std::chrono::milliseconds wait{0};
  bool may_grant = true;  // lease: false = only ready or wait
  std::vector<uint32_t> chunks;  // ready: the chunks the agent waits on (distinct)
  std::string remote;     // the TCP source address
};

namespace {

// Parses the path and method, then the parameters each route needs.
std::optional<Rejection> ParseCall(const BlobRequest& req, std::chrono::milliseconds max_wait,
                                   BlobRoute& route, BlobCall& call);

}  // namespace

BlobApi::BlobApi(BlobApiOptions options, prometheus::Registry& registry, std::string tracker_id,
                 uint64_t seed)
    : options_(std::move(options)),
      tracker_id_(std::move(tracker_id)),
      table_(options_.table, seed),
      metrics_(BlobMetrics::Create(registry)),
      bad_reports_(options_.bad_reports_per_minute) {
  table_.SetListener([this](BlobEvent event, const Digest& digest) { OnEvent(event, digest); });
}

bool BlobApi::Owns(std::string_view path) {
  return path == kPrefix ||
         (path.size() > kPrefix.size() && path.substr(0, kPrefix.size()) == kPrefix &&
          path[kPrefix.size()] == '/');
}

std::string BlobApi::NewTrackerId() {
  std::random_device rd;
  uint64_t id = (uint64_t{rd()} << 32) ^ rd();
  return fmt::format("{:016x}", id);
}

boost::asio::awaitable<BlobResponse> BlobApi::Handle(BlobRequest req) {
  BlobCall call;
  BlobRoute route = BlobRoute::kUnknown;
  std::optional<Rejection> rejected = ParseCall(req, options_.max_wait, route, call);
  if (rejected) {
    BlobResponse response = Error(rejected->status, std::move(rejected->message), RouteName(route));
    response.allow = rejected->allow;
    Finish(response);
    co_return response;
  }
  const bool polls =
      route == BlobRoute::kLease || route == BlobRoute::kWork || route == BlobRoute::kReady;
  if (!polls || call.wait.count() == 0) {
    BlobResponse response = Execute(call, TrackerClock::now());
    Finish(response);
    co_return response;
  }
  // Long-poll: re-ask the table whenever something that could change the answer happened.
  TimePoint deadline = TrackerClock::now() + call.wait;
  bool counted = false;
  if (route == BlobRoute::kReady) {
    for (;;) {
      TimePoint now = TrackerClock::now();
      TimePoint recheck = TimePoint::max();
      auto ready = ReadyAmong(call, now, recheck);
      bool wait = ready && ready.value().empty();
      if (wait && !counted) {
        metrics_.lease_waits.Increment();
        counted = true;
      }
      if (!wait || now >= deadline || stopping_ || waiters_.size() >= options_.max_waiters) {
        BlobResponse response = ReadyResponse(call, ready);
        Finish(response);
        co_return response;
      }
      co_await waiters_.Wait(call.digest, false, std::min(deadline, recheck));
    }
  }
  for (;;) {
    TimePoint now = TrackerClock::now();
    BlobResult<LeaseAnswer> answer =
        route == BlobRoute::kWork
            ? table_.Work(call.digest, call.agent, call.source, now)
            : table_.Lease(call.digest, call.k, call.agent, call.source, now, call.may_grant);
    bool wait = answer && answer.value().kind == LeaseAnswer::Kind::kWait;
    if (wait && !counted) {
      metrics_.lease_waits.Increment();
      counted = true;
    }
    if (!wait || now >= deadline || stopping_ || waiters_.size() >= options_.max_waiters) {
      BlobResponse response = LeaseResponse(answer, RouteName(route));
      Finish(response);
      co_return response;
    }
    bool cap_waiter = answer.value().reason == WaitReason::kClusterCap ||
                      answer.value().reason == WaitReason::kAgentCap;
    TimePoint until = std::min(deadline, answer.value().recheck_at);
    co_await waiters_.Wait(call.digest, cap_waiter, until);
  }
}

BlobResponse BlobApi::HandleNow(const BlobRequest& req, TimePoint now) {
  BlobCall call;
  BlobRoute route = BlobRoute::kUnknown;
  std::optional<Rejection> rejected = ParseCall(req, options_.max_wait, route, call);
  BlobResponse response;
  if (rejected) {
    response = Error(rejected->status, std::move(rejected->message), RouteName(route));
    response.allow = rejected->allow;
  } else {
    response = Execute(call, now);
  }
  Finish(response);
  return response;
}

BlobResponse BlobApi::Execute(const BlobCall& call, TimePoint now) {
  std::string_view route = RouteName(call.route);
  switch (call.route) {
    case BlobRoute::kCreate:
    case BlobRoute::kGet: {
      auto view = call.route == BlobRoute::kCreate ? table_.Ensure(call.digest, call.source, now)
                                                   : table_.Find(call.digest, now);
      if (!view) return Failure(view.error(), route);
      const BlobView& v = view.value();
      json j;
      j["digest"] = call.digest.str();
      AddLayout(j, v.layout);
      j["registry"] = v.source.registry;
      j["repository"] = v.source.repository;
      json chunks = json::array();
      for (const ChunkView& c : v.chunks) {
        json entry;
        entry["state"] = std::string(ChunkStateName(c.state));
        if (c.published) entry["metainfo"] = Base64Encode(c.published->metainfo);
        chunks.push_back(std::move(entry));
      }
      j["chunks"] = std::move(chunks);
      return Json(200, route, std::move(j));
    }
    case BlobRoute::kLease:
    case BlobRoute::kWork: {
      auto answer =
          call.route == BlobRoute::kWork
              ? table_.Work(call.digest, call.agent, call.source, now)
              : table_.Lease(call.digest, call.k, call.agent, call.source, now, call.may_grant);
      if (answer && answer.value().kind == LeaseAnswer::Kind::kWait) {
        metrics_.lease_waits.Increment();
      }
      return LeaseResponse(answer, route);
    }
    case BlobRoute::kReady: {
      TimePoint recheck = TimePoint::max();
      auto ready = ReadyAmong(call, now, recheck);
      if (ready && ready.value().empty()) metrics_.lease_waits.Increment();
      return ReadyResponse(call, ready);
    }
    case BlobRoute::kRenew: {
      auto ttl = table_.Renew(call.digest, call.k, call.agent, call.lease_id, call.bytes, now);
      if (!ttl) return Failure(ttl.error(), route);
      return Json(200, route, json{{"ttl_ms", ttl.value().count()}});
    }
    case BlobRoute::kPublish: {
      auto published = table_.Publish(call.digest, call.k, call.agent, call.lease_id, call.source,
                                      call.metainfo, now);
      if (!published && published.error().code == BlobErrc::kForbidden) {
        metrics_.publishes_refused.Increment();
        spdlog::warn("agent {} ({}) published {}", call.agent, call.remote,
                     published.error().message);
      }
      if (!published) return Failure(published.error(), route);
      const PublishAnswer& p = published.value();
      json j{{"state", "ready"}, {"info_hash", swarm::Sha1Hex(p.published->info_hash)}};
      if (p.kept_existing) j["kept"] = "existing";
      if (p.newly_ready) {
        spdlog::debug("chunk {} of {} published by agent {}{}", call.k, call.digest.str(),
                      call.agent, p.released_lease ? " (lease released)" : "");
      }
      return Json(200, route, std::move(j));
    }
    case BlobRoute::kRelease: {
      auto released = table_.Release(call.digest, call.k, call.agent, call.lease_id, now);
      if (!released) return Failure(released.error(), route);
      return Json(200, route, json::object());
    }
    case BlobRoute::kBad: {
      // Each accepted report makes the cluster fetch the chunk upstream again: a quota spent.
      if (!bad_reports_.Allow(call.remote, now)) {
        metrics_.bad_limited.Increment();
        return Error(429,
                     fmt::format("too many bad-chunk reports from {}: at most {:g} a minute",
                                 call.remote, options_.bad_reports_per_minute),
                     route);
      }
      // Reporters are told apart by address: an agent token holder can name any agent.
      const std::string& source = call.remote;
      auto report = table_.ReportBad(call.digest, call.k, call.info_hash, source, now);
      if (!report) return Failure(report.error(), route);
      const BadReportAnswer& r = report.value();
      if (r.needed > 0) {
        spdlog::log(r.dropped ? spdlog::level::warn : spdlog::level::info,
                    "chunk {} of {}: metainfo {} reported bad by agent {} ({}), {} of {} "
                    "sources; {}",
                    call.k, call.digest.str(), swarm::Sha1Hex(call.info_hash), call.agent,
                    source, r.reporters, r.needed,
                    r.dropped ? "dropped" : "kept until more agree or its seeders are gone");
      }
      json j{{"dropped", r.dropped}};
      if (r.needed > 0) {
        j["reporters"] = r.reporters;
        j["needed"] = r.needed;
      }
      return Json(200, route, std::move(j));
    }
    case BlobRoute::kUnknown:
      break;
  }
  return Error(404, "no such blob API endpoint", route);
}

BlobResult<std::vector<LeaseAnswer>> BlobApi::ReadyAmong(const BlobCall& call, TimePoint now,
                                                        TimePoint& recheck_at) {
  std::vector<LeaseAnswer> ready;
  for (uint32_t k : call.chunks) {
    auto answer = table_.Lease(call.digest, k, call.agent, call.source, now, /*may_grant=*/false);
    if (!answer) return answer.error();
    if (answer.value().kind == LeaseAnswer::Kind::kReady) {
      ready.push_back(std::move(answer.value()));
    } else {
      recheck_at = std::min(recheck_at, answer.value().recheck_at);
    }
  }
  return ready;
}

BlobResponse BlobApi::ReadyResponse(const BlobCall& call,
                                    const BlobResult<std::vector<LeaseAnswer>>& result) {
  std::string_view route = RouteName(BlobRoute::kReady);
  if (!result) return Failure(result.error(), route);
  auto view = table_.Find(call.digest, TrackerClock::now());
  if (!view) return Failure(view.error(), route);
  json j;
  AddLayout(j, view.value().layout);
  if (result.value().empty()) {
    j["state"] = "wait";
    j["retry_after_ms"] = 1000;
    return Json(200, route, std::move(j));
  }
  json chunks = json::array();
  for (const LeaseAnswer& a : result.value()) {
    chunks.push_back(json{{"chunk", a.chunk}, {"metainfo", Base64Encode(a.published->metainfo)}});
  }
  j["state"] = "ready";
  j["chunks"] = std::move(chunks);
  return Json(200, route, std::move(j));
}

BlobResponse BlobApi::LeaseResponse(const BlobResult<LeaseAnswer>& result,
                                    std::string_view route) const {
  if (!result) return Failure(result.error(), route);
  const LeaseAnswer& a = result.value();
  json j;
  AddLayout(j, a.layout);
  switch (a.kind) {
    case LeaseAnswer::Kind::kDone:
      j["state"] = "done";
      break;
    case LeaseAnswer::Kind::kReady:
      j["state"] = "ready";
      j["metainfo"] = Base64Encode(a.published->metainfo);
      break;
    case LeaseAnswer::Kind::kGranted:
      j["state"] = "granted";
      j["chunk"] = a.chunk;
      j["lease_id"] = a.lease_id;
      j["ttl_ms"] = a.ttl.count();
      j["begin"] = a.begin;
      j["length"] = a.length;
      break;
    case LeaseAnswer::Kind::kWait:
      j["state"] = "wait";
      j["retry_after_ms"] = a.retry_after.count();
      j["reason"] = std::string(WaitReasonName(a.reason));
      break;
  }
  return Json(200, route, std::move(j));
}

BlobResponse BlobApi::Json(unsigned status, std::string_view route, json body) const {
  body["tracker_id"] = tracker_id_;
  BlobResponse response;
  response.status = status;
  // Strings echoed from queries need not be UTF-8; never let that throw.
  response.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  response.route = route;
  return response;
}

BlobResponse BlobApi::Error(unsigned status, std::string message, std::string_view route) const {
  return Json(status, route, json{{"error", std::move(message)}});
}

BlobResponse BlobApi::Failure(const BlobError& error, std::string_view route) const {
  return Error(StatusOf(error.code), error.message, route);
}

void BlobApi::Finish(const BlobResponse& response) {
  metrics_.CountRequest(response.route, response.status);
  metrics_.leases_active.Set(static_cast<double>(table_.totals().leases));
  metrics_.blobs.Set(static_cast<double>(table_.totals().blobs));
}

void BlobApi::OnEvent(BlobEvent event, const Digest& digest) {
  switch (event) {
    case BlobEvent::kGranted:
      metrics_.leases_granted.Increment();
      return;
    case BlobEvent::kExpired:
      metrics_.leases_expired.Increment();
      spdlog::info("lease on a chunk of {} expired", digest.str());
      waiters_.WakeBlob(digest);
      waiters_.WakeCapWaiters();
      return;
    case BlobEvent::kReleased:
      metrics_.leases_released.Increment();
      waiters_.WakeBlob(digest);
      waiters_.WakeCapWaiters();
      return;
    case BlobEvent::kPublished:
      metrics_.chunks_published.Increment();
      waiters_.WakeBlob(digest);
      return;
    case BlobEvent::kDropped:
      spdlog::info(
          "a ready chunk of {} was dropped (reported bad, or its seeders all left); it "
          "will be leased and fetched upstream again",
          digest.str());
      waiters_.WakeBlob(digest);
      return;
    case BlobEvent::kEvicted:
      waiters_.WakeBlob(digest);
      return;
  }
}

void BlobApi::Shutdown() {
  stopping_ = true;
  waiters_.WakeAll();
}

void BlobApi::Sweep(TimePoint now) {
  table_.ExpireLeases(now);
  metrics_.leases_active.Set(static_cast<double>(table_.totals().leases));
  metrics_.blobs.Set(static_cast<double>(table_.totals().blobs));
}

std::string BlobApi::StatusSection(TimePoint now) const {
  const BlobTableOptions& o = table_.options();
  BlobTotals t = table_.totals();
  std::string out;
  out += fmt::format("blobs {} (max {}), chunks {} ready of {}; chunk size {}, piece size {}\n",
                     t.blobs, o.max_blobs, t.ready, t.chunks, FormatBytes(o.chunk_size),
                     FormatBytes(o.piece_size));
  out += fmt::format(
      "upstream leases {} active (limit now {}, from {} to {} in the cluster, {} per agent), "
      "ttl {} s; {} lease requests long-polling\n",
      t.leases, table_.upstream_limit(), o.base_upstream_fetchers, o.max_upstream_fetchers,
      o.max_leases_per_agent, std::chrono::duration<double>(o.lease_ttl).count(), waiters_.size());
  auto leases = table_.ActiveLeases(kStatusPageLeases);
  if (leases.empty()) return out;
  out += fmt::format("\n{:<71}  {:>6}  {:<24}  {:>21}  {:>10}\n", "blob", "chunk", "agent",
                     "progress", "expires in");
  for (const LeaseSummary& l : leases) {
    double left = std::chrono::duration<double>(l.expires - now).count();
    out +=
        fmt::format("{:<71}  {:>6}  {:<24}  {:>9} / {:>9}  {:>8.1f} s\n", l.digest.str(), l.chunk,
                    l.agent.substr(0, 24), FormatBytes(l.bytes), FormatBytes(l.length), left);
  }
  if (t.leases > leases.size()) {
    out += fmt::format("... and {} more leases\n", t.leases - leases.size());
  }
  return out;
}

namespace {

std::optional<Rejection> ParseSource(const Body& body, BlobSource& source) {
  if (auto r = body.Unsigned("size", source.size)) return r;
  if (source.size == 0) return Rejection{400, "\"size\" must be a positive number of bytes"};
  if (auto r = body.String("registry", true, kMaxSourceBytes, source.registry)) return r;
  if (auto r = body.String("repository", true, kMaxSourceBytes, source.repository)) return r;
  return std::nullopt;
}

std::optional<Rejection> ParseAgent(const Body& body, std::string& agent) {
  if (auto r = body.String("agent", true, SIZE_MAX, agent)) return r;
  return CheckId("\"agent\"", agent, kMaxAgentBytes);
}

std::optional<Rejection> ParseCall(const BlobRequest& req, std::chrono::milliseconds max_wait,
                                   BlobRoute& route, BlobCall& call) {
  call.remote = req.remote.is_unspecified() ? std::string() : req.remote.to_string();
  // Path: /v1/blobs/{digest}[/work|/ready|/chunks/{k}[/lease|/renew|/bad]]
  std::string_view rest = req.path.substr(std::min(req.path.size(), kPrefix.size() + 1));
  std::vector<std::string_view> parts;
  while (!rest.empty() && parts.size() <= 4) {
    size_t slash = rest.find('/');
    parts.push_back(rest.substr(0, slash));
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
    if (slash != std::string_view::npos && rest.empty()) parts.emplace_back();  // trailing '/'
  }
  bool shape_ok = (parts.size() == 1 || (parts.size() == 2 && (parts[1] == "work" || parts[1] == "ready")) ||
                   (parts.size() >= 3 && parts[1] == "chunks")) &&
                  parts.size() <= 4 &&
                  std::none_of(parts.begin(), parts.end(), [](auto p) { return p.empty(); });
  std::string_view action = parts.size() == 4 ? parts[3] : std::string_view();
  if (!shape_ok ||
      (parts.size() == 4 && action != "lease" && action != "renew" && action != "bad")) {
    route = BlobRoute::kUnknown;
    return Rejection{404, "no such blob API endpoint: " + Quoted(req.path) +
                              " (want /v1/blobs/{digest}[/work|/ready|/chunks/{k}[/lease|/renew|/bad]])"};
  }

  // Method.
  http::verb m = req.method;
  std::string_view allow;
  if (parts.size() == 1) {
    allow = "GET, HEAD, POST";
    if (m == http::verb::get || m == http::verb::head) route = BlobRoute::kGet;
    if (m == http::verb::post) route = BlobRoute::kCreate;
  } else if (parts.size() == 2) {
    allow = "POST";
    if (m == http::verb::post) route = parts[1] == "work" ? BlobRoute::kWork : BlobRoute::kReady;
  } else if (parts.size() == 3) {
    allow = "PUT";
    if (m == http::verb::put) route = BlobRoute::kPublish;
  } else if (action == "lease") {
    allow = "POST, DELETE";
    if (m == http::verb::post) route = BlobRoute::kLease;
    if (m == http::verb::delete_) route = BlobRoute::kRelease;
  } else {
    allow = "POST";
    if (m == http::verb::post) route = action == "renew" ? BlobRoute::kRenew : BlobRoute::kBad;
  }
  if (route == BlobRoute::kUnknown) {
    return Rejection{
        405, std::string(http::to_string(m)) + " is not supported here; use " + std::string(allow),
        allow};
  }
  call.route = route;

  // Digest and chunk index.
  auto digest_text = PercentDecode(parts[0], "digest");
  if (!digest_text) return Rejection{400, digest_text.error().message};
  auto digest = Digest::Parse(digest_text.value());
  if (!digest) return Rejection{400, "bad digest in path: " + digest.error().message};
  call.digest = std::move(digest.value());
  if (parts.size() >= 3) {
    auto k = ParseDecimal(parts[2], 10);
    if (!k || *k > UINT32_MAX) {
      return Rejection{
          400, "chunk index " + Quoted(parts[2]) + " is not a non-negative integer below 2^32"};
    }
    call.k = static_cast<uint32_t>(*k);
  }

  // Query parameters.
  std::map<std::string, std::string> query;
  if (auto r = ParseQuery(req.query, query)) return r;
  if (route == BlobRoute::kLease) {
    if (auto it = query.find("grant"); it != query.end()) {
      if (it->second != "0" && it->second != "1") {
        return Rejection{400, "grant " + Quoted(it->second) + " is not 0 or 1"};
      }
      call.may_grant = it->second == "1";
    }
  }
  if (route == BlobRoute::kLease || route == BlobRoute::kWork || route == BlobRoute::kReady) {
    if (auto it = query.find("wait_ms"); it != query.end()) {
      auto wait = ParseDecimal(it->second, 19);
      if (!wait) {
        return Rejection{400, "wait_ms " + Quoted(it->second) + " is not a non-negative integer"};
      }
      call.wait = std::min<std::chrono::milliseconds>(
          std::chrono::milliseconds(static_cast<int64_t>(std::min<uint64_t>(*wait, INT64_MAX))),
          max_wait);
    }
  }
  if (route == BlobRoute::kRelease) {
    auto agent = query.find("agent");
    if (agent == query.end()) return Rejection{400, "query parameter \"agent\" is missing"};
    if (auto r = CheckId("agent", agent->second, kMaxAgentBytes)) return r;
    call.agent = agent->second;
    auto lease = query.find("lease_id");
    if (lease == query.end()) return Rejection{400, "query parameter \"lease_id\" is missing"};
    if (auto r = CheckId("lease_id", lease->second, kMaxLeaseIdBytes)) return r;
    call.lease_id = lease->second;
    return std::nullopt;
  }
  if (route == BlobRoute::kGet) return std::nullopt;

  // JSON body.
  Body body;
  if (auto r = Body::Parse(req.body, body)) return r;
  switch (route) {
    case BlobRoute::kCreate:
      return ParseSource(body, call.source);
    case BlobRoute::kLease:
    case BlobRoute::kWork:
      if (auto r = ParseAgent(body, call.agent)) return r;
      return ParseSource(body, call.source);
    case BlobRoute::kReady: {
      if (auto r = ParseAgent(body, call.agent)) return r;
      if (auto r = ParseSource(body, call.source)) return r;
      const json* chunks = body.Find("chunks");
      if (chunks == nullptr || !chunks->is_array() || chunks->empty() ||
          chunks->size() > kMaxReadyChunks) {
        return Rejection{400, fmt::format("\"chunks\" must be an array of 1 to {} chunk indexes",
                                          kMaxReadyChunks)};
      }
      for (const json& k : *chunks) {
        if (!k.is_number_unsigned() || k.get<uint64_t>() > UINT32_MAX) {
          return Rejection{400, "\"chunks\" holds " + Quoted(k.dump()) +
                                    ", not a non-negative integer below 2^32"};
        }
        uint32_t index = static_cast<uint32_t>(k.get<uint64_t>());
        if (std::find(call.chunks.begin(), call.chunks.end(), index) != call.chunks.end()) {
          return Rejection{400, "\"chunks\" names chunk " + std::to_string(index) + " twice"};
        }
        call.chunks.push_back(index);
      }
      return std::nullopt;
    }
    case BlobRoute::kRenew:
      if (auto r = ParseAgent(body, call.agent)) return r;
      if (auto r = body.String("lease_id", true, SIZE_MAX, call.lease_id)) return r;
      if (auto r = CheckId("\"lease_id\"", call.lease_id, kMaxLeaseIdBytes)) return r;
      return body.Unsigned("bytes", call.bytes);
    case BlobRoute::kPublish: {
      if (auto r = ParseAgent(body, call.agent)) return r;
      if (auto r = body.String("lease_id", false, kMaxLeaseIdBytes, call.lease_id)) return r;
      if (auto r = ParseSource(body, call.source)) return r;
      std::string encoded;
      // Base64 of at most 4 MiB of metainfo; the body limit bounds it anyway.
      if (auto r = body.String("metainfo", true, 8u << 20, encoded)) return r;
      auto decoded = Base64Decode(encoded);
      if (!decoded || decoded->empty()) {
        return Rejection{400, "\"metainfo\" is not non-empty base64 (RFC 4648, with padding)"};
      }
      call.metainfo = std::move(*decoded);
      return std::nullopt;
    }
    case BlobRoute::kBad: {
      if (auto r = ParseAgent(body, call.agent)) return r;
      std::string hex;
      if (auto r = body.String("info_hash", true, 64, hex)) return r;
      auto hash = ParseInfoHash(hex);
      if (!hash) return Rejection{400, "\"info_hash\" must be 40 hex characters (a v1 info-hash)"};
      call.info_hash = *hash;
      return std::nullopt;
    }
    case BlobRoute::kGet:
    case BlobRoute::kRelease:
    case BlobRoute::kUnknown:
      break;
  }
  return std::nullopt;
}

}  // namespace

}  // namespace shoal::tracker
