#include "agent/tracker_client.h"

#include "lib/swarm/session.h"

#include "lib/auth/tokens.h"

#include <algorithm>
#include <random>

#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>

#include "lib/core/base64.h"
#include "lib/core/sha256.h"
#include "lib/http/retry_after.h"

namespace shoal::agent {
namespace asio = boost::asio;
namespace http_ = boost::beast::http;
using asio::awaitable;
using nlohmann::json;

namespace {

constexpr size_t kMaxReply = 16u << 20;

uint64_t Score(const http::Url& tracker, const Digest& digest) {
  std::string key = tracker.str() + "|" + digest.hex();
  std::string hex = Sha256::Of(key).hex().substr(0, 16);
  return std::stoull(hex, nullptr, 16);
}

Error ReplyError(unsigned status, const std::string& body, const std::string& what) {
  std::string message = what + ": tracker answered " + std::to_string(status);
  try {
    json j = json::parse(body);
    if (j.contains("error") && j["error"].is_string())
      message += " (" + j["error"].get<std::string>() + ")";
  } catch (const std::exception&) {
  }
  ErrorCode code = ErrorCode::kProtocol;
  if (status == 404) code = ErrorCode::kNotFound;
  if (status == 409) code = ErrorCode::kDenied;
  if (status == 400) code = ErrorCode::kInvalidArgument;
  if (status >= 500) code = ErrorCode::kUnavailable;
  return MakeError(code, message);
}

Result<swarm::ChunkLayout> LayoutOf(const json& j) {
  swarm::ChunkLayout layout;
  layout.blob_size = j.at("size").get<uint64_t>();
  layout.chunk_size = j.at("chunk_size").get<uint64_t>();
  layout.piece_size = j.at("piece_size").get<uint32_t>();
  layout.first_chunk_size = j.value("first_chunk_size", uint64_t{0});
  if (auto st = layout.Validate(); !st) {
    return MakeError(ErrorCode::kProtocol, "tracker chunk layout: " + st.error().message);
  }
  return layout;
}

Result<std::string> MetainfoOf(const json& j) {
  auto decoded = Base64Decode(j.at("metainfo").get<std::string>());
  if (!decoded) return MakeError(ErrorCode::kProtocol, "tracker metainfo is not base64");
  return std::move(*decoded);
}

json SourceJson(const std::string& agent, const BlobSource& source) {
  return json{{"agent", agent},
              {"size", source.size},
              {"registry", source.registry},
              {"repository", source.repository}};
}

Result<ChunkTable> ParseTable(const std::string& body) {
  try {
    json j = json::parse(body);
    auto layout = LayoutOf(j);
    if (!layout) return layout.error();
    ChunkTable table;
    table.layout = layout.value();
    const json& chunks = j.at("chunks");
    if (!chunks.is_array() || chunks.size() != table.layout.chunk_count()) {
      return MakeError(ErrorCode::kProtocol, "tracker chunk table has the wrong chunk count");
    }
    for (const json& c : chunks) {
      if (c.value("state", "") == "ready") {
        auto m = MetainfoOf(c);
        if (!m) return m.error();
        table.metainfo.push_back(std::move(m.value()));
      } else {
        table.metainfo.emplace_back();
      }
    }
    return table;
  } catch (const std::exception& e) {
    return MakeError(ErrorCode::kProtocol, std::string("tracker chunk table: ") + e.what());
  }
}

}  // namespace

TrackerClient::TrackerClient(asio::any_io_executor executor, TrackerClientOptions options)
    : executor_(executor),
      options_(std::move(options)),
      tracker_ids_(options_.trackers.size()),
      failing_since_(options_.trackers.size()),
      answered_at_(options_.trackers.size()),
      http_announces_(options_.trackers.size(), false),
      failing_noted_(options_.trackers.size()) {
  http::ClientConfig config;
  config.connect_timeout = options_.connect_timeout;
  // Longer than the longest long-poll the tracker will hold (10 s).
  config.idle_timeout = std::chrono::milliseconds(20000);
  http_ = std::make_unique<http::Client>(std::move(executor), config);
}

std::vector<std::string> TrackerClient::AnnounceUrls() const {
  std::vector<std::string> out;
  for (size_t r = 0; r < options_.trackers.size(); ++r) {
    if (options_.relay_url) {
      out.push_back(options_.relay_url(r));
      continue;
    }
    http::Url u = options_.trackers[r];
    // libtorrent sends no headers (and on loopback allows no other path): the token's announce
    // key rides in the query.
    u.target = options_.token ? "/announce?auth=" + auth::AnnounceKey(options_.token->Current())
                              : "/announce";
    if (AnnouncesOverUdp(r)) {
      const bool v6 = u.host.find(':') != std::string::npos;
      out.push_back("udp://" + (v6 ? "[" + u.host + "]" : u.host) + ":" + std::to_string(u.port) +
                    u.target);
    } else {
      out.push_back(u.str());
    }
  }
  return out;
}

std::vector<std::string> TrackerClient::AnnounceUrls(const Digest& digest) const {
  std::vector<std::string> all = AnnounceUrls();
  std::vector<size_t> order = Order(digest);
  // Replicas that failed their last call go last: libtorrent tries the tiers in turn, and a
  // dead one costs a whole announce timeout (a UDP announce, or TCP to a host that is down).
  std::stable_partition(order.begin(), order.end(),
                        [this](size_t r) { return !failing_since_[r].has_value(); });
  std::vector<std::string> out;
  for (size_t i : order) out.push_back(std::move(all[i]));
  return out;
}

std::vector<size_t> TrackerClient::Order(const Digest& digest) const {
  std::vector<std::pair<uint64_t, size_t>> scored;
  for (size_t i = 0; i < options_.trackers.size(); ++i)
    scored.emplace_back(Score(options_.trackers[i], digest), i);
  std::sort(scored.begin(), scored.end(), std::greater<>());
  std::vector<size_t> out;
  for (auto& [score, i] : scored) out.push_back(i);
  return out;
}

size_t TrackerClient::Owner(const Digest& digest) const {
  std::vector<size_t> order = Order(digest);
  for (size_t r : order) {
    if (!failing_since_[r]) return r;
  }
  return order.empty() ? 0 : order.front();
}

bool TrackerClient::Reaches(const std::vector<size_t>& order, size_t replica) const {
  for (size_t r : order) {
    if (r == replica) return true;
    if (r < failing_since_.size() && !failing_since_[r]) return false;
  }
  return false;
}

std::vector<size_t> TrackerClient::ReplicasOf(const std::vector<std::string>& announce_urls) const {
  // A replica's URL moves from udp:// to http:// (AnnounceOverHttp) and its key changes with
  // the token.
  auto base = [](std::string_view url) { return swarm::AnnounceUrlBase(url); };
  const std::vector<std::string> ours = AnnounceUrls();
  std::vector<size_t> out;
  for (const std::string& url : announce_urls) {
    for (size_t r = 0; r < ours.size(); ++r) {
      if (base(ours[r]) == base(url)) {
        out.push_back(r);
        break;
      }
    }
  }
  return out;
}

void TrackerClient::NoteTrackerId(size_t replica, const std::string& body) {
  std::string id;
  try {
    json j = json::parse(body);
    if (j.contains("tracker_id") && j["tracker_id"].is_string()) id = j["tracker_id"];
  } catch (const std::exception&) {
    return;
  }
  NoteTrackerIdValue(replica, id);
}

void TrackerClient::NoteTrackerIdValue(size_t replica, const std::string& id) {
  if (id.empty()) return;
  std::string& known = tracker_ids_[replica];
  bool restarted = !known.empty() && known != id;
  known = id;
  if (restarted) {
    spdlog::warn("tracker {} restarted (new id {}); re-publishing what this agent holds",
                 options_.trackers[replica].str(), id);
    if (on_restart_) on_restart_(replica);
  }
}

std::chrono::milliseconds TrackerRetryPause(const Error& e) {
  if (e.code != ErrorCode::kTooManyRequests) return std::chrono::milliseconds(500);
  thread_local std::minstd_rand rng{std::random_device{}()};
  const int64_t base = std::clamp<int64_t>(int64_t{e.retry_after_s} * 1000, 200, 10'000);
  return std::chrono::milliseconds(
      std::uniform_int_distribution<int64_t>(base / 2, base + base / 2)(rng));
}

awaitable<Result<TrackerClient::Reply>> TrackerClient::CallReplica(size_t replica,
                                                                   http_::verb method,
                                                                   const std::string& target,
                                                                   const std::string& body) {
  http::Request req;
  req.method = method;
  req.url = options_.trackers[replica];
  req.url.target = target;
  req.body = body;
  if (!body.empty()) req.headers.set(http_::field::content_type, "application/json");
  if (options_.token) req.headers.set(http_::field::authorization, "Bearer " + Token());
  auto opened = co_await http_->Open(req);
  if (!opened) {
    spdlog::debug("tracker {} did not answer: {}", req.url.str(), opened.error().message);
    NoteHealth(replica, false);
    co_return opened.error();
  }
  auto& resp = *opened.value();
  auto read = co_await resp.ReadAll(kMaxReply);
  if (!read) {
    NoteHealth(replica, false);
    co_return read.error();
  }
  if (resp.status() == 503 && !resp.header(http_::field::retry_after).empty()) {
    // A full tracker (--max-connections) sheds with 503 + Retry-After: it is alive, and asking
    // another replica would split the blob's leases over two tables. The caller waits and asks
    // it again (ChunkFetchOptions::tracker_busy_grace).
    NoteHealth(replica, true);
    Error busy = MakeError(ErrorCode::kTooManyRequests,
                           "tracker " + req.url.str() + " is full (503, Retry-After " +
                               std::string(resp.header(http_::field::retry_after)) + ")");
    busy.retry_after_s = std::max(1, http::RetryAfterSeconds(resp.header(http_::field::retry_after)));
    co_return busy;
  }
  if (resp.status() >= 502 && resp.status() <= 504) {  // a proxy in front of a dead replica
    NoteHealth(replica, false);
    co_return MakeError(ErrorCode::kUnavailable,
                        "tracker " + req.url.str() + " answered " + std::to_string(resp.status()));
  }
  NoteHealth(replica, true);
  if (std::string_view id = resp.header("Shoal-Tracker-Id"); !id.empty()) {
    NoteTrackerIdValue(replica, std::string(id));  // answers that are not JSON (announce batches)
  } else {
    NoteTrackerId(replica, read.value());
  }
  co_return Reply{resp.status(), std::move(read.value()), replica};
}

awaitable<Result<TrackerClient::Reply>> TrackerClient::Call(const Digest& digest,
                                                            http_::verb method, std::string target,
                                                            std::string body) {
  if (options_.trackers.empty()) co_return MakeError(ErrorCode::kUnavailable, "no tracker");
  std::optional<Error> last;
  // Replicas that answer come first, in rendezvous order: a dead owner (a blackholed address
  // costs the whole connect timeout) is asked only after the live ones.
  std::vector<size_t> order = Order(digest);
  std::stable_partition(order.begin(), order.end(),
                        [this](size_t r) { return !failing_since_[r].has_value(); });
  for (size_t replica : order) {
    auto reply = co_await CallReplica(replica, method, target, body);
    if (reply) co_return std::move(reply.value());
    if (reply.error().code == ErrorCode::kTooManyRequests) co_return reply.error();  // busy
    last = reply.error();
  }
  co_return MakeError(ErrorCode::kUnavailable,
                      "no tracker answered (" + (last ? last->message : std::string("?")) + ")");
}

bool TrackerClient::AnnouncesOverUdp(size_t replica) const {
  return options_.udp_announce && options_.trackers[replica].scheme == "http" &&
         !http_announces_[replica];
}

void TrackerClient::AnnounceOverHttp(size_t replica, std::string_view why) {
  if (!AnnouncesOverUdp(replica)) return;
  http_announces_[replica] = true;
  spdlog::error(
      "tracker {}: {}; announcing to it over HTTP from now on (let UDP port {} through to the "
      "trackers, or run the agents with --tracker-announce http)",
      options_.trackers[replica].str(), why, options_.trackers[replica].port);
}

bool TrackerClient::AnsweredWithin(size_t replica, std::chrono::milliseconds within) const {
  return answered_at_[replica] && Clock::now() - *answered_at_[replica] <= within;
}

bool TrackerClient::Unreachable(std::chrono::milliseconds grace) const {
  return all_failing_since_ && Clock::now() - *all_failing_since_ >= grace;
}

size_t TrackerClient::healthy_replicas() const {
  return static_cast<size_t>(std::count_if(failing_since_.begin(), failing_since_.end(),
                                           [](const auto& f) { return !f.has_value(); }));
}

void TrackerClient::NoteHealth(size_t replica, bool ok) {
  if (ok) {
    answered_at_[replica] = Clock::now();
    failing_since_[replica].reset();
    if (all_failing_since_) {
      spdlog::info(
          "tracker {} answers again after {} ms without any replica",
          options_.trackers[replica].str(),
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - *all_failing_since_)
              .count());
      all_failing_since_.reset();
    }
    return;
  }
  if (!failing_since_[replica]) {
    failing_since_[replica] = Clock::now();
    std::optional<Clock::time_point>& noted = failing_noted_[replica];
    if (on_failing_ && (!noted || Clock::now() - *noted >= std::chrono::minutes(1))) {
      noted = Clock::now();
      spdlog::warn("tracker {} stopped answering; the blobs it owns move to the next replicas",
                   options_.trackers[replica].str());
      on_failing_(replica);
    }
  }
  if (healthy_replicas() == 0 && !all_failing_since_) {
    all_failing_since_ = Clock::now();
    spdlog::warn("no tracker replica answers; probing their /healthz until one does");
  }
  if (!probing_ && all_failing_since_) {
    probing_ = true;
    asio::co_spawn(executor_, Probe(), asio::detached);
  }
}

awaitable<void> TrackerClient::Probe() {
  auto pause = std::chrono::milliseconds(500);
  while (all_failing_since_) {
    asio::steady_timer timer(executor_);
    timer.expires_after(pause);
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    pause = std::min(pause * 2, std::chrono::milliseconds(5000));
    for (size_t r = 0; r < options_.trackers.size() && all_failing_since_; ++r) {
      auto reply = co_await CallReplica(r, http_::verb::get, "/healthz", "");
      (void)reply;
    }
  }
  probing_ = false;
}

awaitable<Result<ChunkTable>> TrackerClient::Table(const Digest& digest, const BlobSource& source) {
  std::string body = SourceJson(options_.agent_id, source).dump();
  std::string target = "/v1/blobs/" + digest.str();
  auto reply = co_await Call(digest, http_::verb::post, std::move(target), std::move(body));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200)
    co_return ReplyError(reply.value().status, reply.value().body, "chunk table " + digest.str());
  co_return ParseTable(reply.value().body);
}

awaitable<Result<ChunkTable>> TrackerClient::FindTable(const Digest& digest) {
  std::string target = "/v1/blobs/" + digest.str(), body;
  auto reply = co_await Call(digest, http_::verb::get, std::move(target), std::move(body));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200)
    co_return ReplyError(reply.value().status, reply.value().body, "chunk table " + digest.str());
  co_return ParseTable(reply.value().body);
}

namespace {

Result<LeaseAnswer> ParseLeaseAnswer(const std::string& body) {
  try {
    json j = json::parse(body);
    LeaseAnswer out;
    auto layout = LayoutOf(j);
    if (!layout) return layout.error();
    out.layout = layout.value();
    std::string state = j.at("state").get<std::string>();
    if (state == "ready") {
      out.kind = LeaseAnswer::Kind::kReady;
      auto m = MetainfoOf(j);
      if (!m) return m.error();
      out.metainfo = std::move(m.value());
    } else if (state == "granted") {
      out.kind = LeaseAnswer::Kind::kGranted;
      out.chunk = j.value("chunk", uint32_t{0});
      out.lease_id = j.at("lease_id").get<std::string>();
      out.ttl = std::chrono::milliseconds(j.at("ttl_ms").get<int64_t>());
      if (out.chunk >= out.layout.chunk_count()) {
        return MakeError(ErrorCode::kProtocol, "tracker granted chunk " +
                                                   std::to_string(out.chunk) + " of " +
                                                   std::to_string(out.layout.chunk_count()));
      }
    } else if (state == "wait") {
      out.kind = LeaseAnswer::Kind::kWait;
      out.retry_after = std::chrono::milliseconds(j.value("retry_after_ms", int64_t{1000}));
      out.reason = j.value("reason", "");
    } else if (state == "done") {
      out.kind = LeaseAnswer::Kind::kDone;
    } else {
      return MakeError(ErrorCode::kProtocol, "tracker lease state \"" + state + "\" unknown");
    }
    return out;
  } catch (const std::exception& e) {
    return MakeError(ErrorCode::kProtocol, std::string("tracker lease answer: ") + e.what());
  }
}

}  // namespace

awaitable<Result<LeaseAnswer>> TrackerClient::Lease(const Digest& digest, uint32_t k,
                                                    const BlobSource& source,
                                                    std::chrono::milliseconds wait,
                                                    bool may_grant) {
  std::string target = "/v1/blobs/" + digest.str() + "/chunks/" + std::to_string(k) +
                       "/lease?wait_ms=" + std::to_string(wait.count()) +
                       (may_grant ? "" : "&grant=0");
  std::string body = SourceJson(options_.agent_id, source).dump();
  auto reply = co_await Call(digest, http_::verb::post, std::move(target), std::move(body));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200) {
    co_return ReplyError(reply.value().status, reply.value().body,
                         "lease for chunk " + std::to_string(k) + " of " + digest.str());
  }
  co_return ParseLeaseAnswer(reply.value().body);
}

awaitable<Result<LeaseAnswer>> TrackerClient::Work(const Digest& digest, const BlobSource& source,
                                                   std::chrono::milliseconds wait) {
  std::string target =
      "/v1/blobs/" + digest.str() + "/work?wait_ms=" + std::to_string(wait.count());
  std::string body = SourceJson(options_.agent_id, source).dump();
  auto reply = co_await Call(digest, http_::verb::post, std::move(target), std::move(body));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200) {
    co_return ReplyError(reply.value().status, reply.value().body,
                         "upstream work on " + digest.str());
  }
  co_return ParseLeaseAnswer(reply.value().body);
}

awaitable<Result<ReadyAnswer>> TrackerClient::Ready(const Digest& digest,
                                                    const std::vector<uint32_t>& chunks,
                                                    const BlobSource& source,
                                                    std::chrono::milliseconds wait) {
  std::string target =
      "/v1/blobs/" + digest.str() + "/ready?wait_ms=" + std::to_string(wait.count());
  json body = SourceJson(options_.agent_id, source);
  body["chunks"] = chunks;
  auto reply = co_await Call(digest, http_::verb::post, std::move(target), body.dump());
  if (!reply) co_return reply.error();
  if (reply.value().status != 200) {
    co_return ReplyError(reply.value().status, reply.value().body,
                         "ready poll for " + digest.str());
  }
  try {
    json j = json::parse(reply.value().body);
    ReadyAnswer out;
    auto layout = LayoutOf(j);
    if (!layout) co_return layout.error();
    out.layout = layout.value();
    std::string state = j.at("state").get<std::string>();
    if (state == "wait") {
      out.retry_after = std::chrono::milliseconds(j.value("retry_after_ms", int64_t{1000}));
      co_return out;
    }
    if (state != "ready") {
      co_return MakeError(ErrorCode::kProtocol, "tracker ready state \"" + state + "\" unknown");
    }
    for (const json& c : j.at("chunks")) {
      uint32_t k = c.at("chunk").get<uint32_t>();
      if (std::find(chunks.begin(), chunks.end(), k) == chunks.end()) {
        co_return MakeError(ErrorCode::kProtocol,
                            "tracker answered a ready poll with chunk " + std::to_string(k) +
                                ", which was not asked for");
      }
      auto m = MetainfoOf(c);
      if (!m) co_return m.error();
      out.ready.emplace_back(k, std::move(m.value()));
    }
    co_return out;
  } catch (const std::exception& e) {
    co_return MakeError(ErrorCode::kProtocol, std::string("tracker ready answer: ") + e.what());
  }
}

awaitable<Status> TrackerClient::Renew(const Digest& digest, uint32_t k,
                                       const std::string& lease_id, uint64_t bytes) {
  json j{{"agent", options_.agent_id}, {"lease_id", lease_id}, {"bytes", bytes}};
  std::string target = "/v1/blobs/" + digest.str() + "/chunks/" + std::to_string(k) + "/renew";
  std::string body = j.dump();
  auto reply = co_await Call(digest, http_::verb::post, std::move(target), std::move(body));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200)
    co_return ReplyError(reply.value().status, reply.value().body, "lease renewal");
  co_return Ok();
}

awaitable<Status> TrackerClient::Publish(const Digest& digest, uint32_t k, const BlobSource& source,
                                         const std::string& lease_id, const std::string& metainfo) {
  json j = SourceJson(options_.agent_id, source);
  if (!lease_id.empty()) j["lease_id"] = lease_id;
  j["metainfo"] = Base64Encode(metainfo);
  std::string target = "/v1/blobs/" + digest.str() + "/chunks/" + std::to_string(k);
  std::string body = j.dump();
  auto reply = co_await Call(digest, http_::verb::put, std::move(target), std::move(body));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200)
    co_return ReplyError(reply.value().status, reply.value().body, "publish");
  co_return Ok();
}

awaitable<Status> TrackerClient::Release(const Digest& digest, uint32_t k,
                                         const std::string& lease_id) {
  std::string target = "/v1/blobs/" + digest.str() + "/chunks/" + std::to_string(k) +
                       "/lease?agent=" + http::QueryEscape(options_.agent_id) +
                       "&lease_id=" + http::QueryEscape(lease_id);
  std::string body;
  auto reply = co_await Call(digest, http_::verb::delete_, std::move(target), std::move(body));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200)
    co_return ReplyError(reply.value().status, reply.value().body, "lease release");
  co_return Ok();
}

awaitable<Status> TrackerClient::ReportBad(const Digest& digest, uint32_t k,
                                           const std::string& info_hash_hex) {
  json j{{"agent", options_.agent_id}, {"info_hash", info_hash_hex}};
  std::string target = "/v1/blobs/" + digest.str() + "/chunks/" + std::to_string(k) + "/bad";
  std::string body = j.dump();
  auto reply = co_await Call(digest, http_::verb::post, std::move(target), std::move(body));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200)
    co_return ReplyError(reply.value().status, reply.value().body, "bad chunk report");
  co_return Ok();
}

// ---- The cluster-wide manifest cache ----

namespace {

// The rendezvous key of a manifest reference: every agent asks the same owner replica.
Digest ManifestOwnerKey(const ManifestRef& ref) {
  return Sha256::Of("manifest|" + ref.registry + "/" + ref.repository + "|" + ref.reference);
}

json ManifestRefJson(const std::string& agent, const ManifestRef& ref) {
  return json{{"agent", agent},
              {"registry", ref.registry},
              {"repository", ref.repository},
              {"reference", ref.reference}};
}

Result<TrackerManifest> ParseManifestAnswer(const std::string& body) {
  try {
    json j = json::parse(body);
    TrackerManifest out;
    std::string state = j.at("state").get<std::string>();
    if (state == "found") {
      out.kind = TrackerManifest::Kind::kFound;
      out.digest = j.at("digest").get<std::string>();
      out.media_type = j.at("media_type").get<std::string>();
      auto decoded = Base64Decode(j.at("manifest").get<std::string>());
      if (!decoded) return MakeError(ErrorCode::kProtocol, "tracker manifest is not base64");
      out.body = std::move(*decoded);
      out.age = std::chrono::milliseconds(std::max<int64_t>(0, j.value("age_ms", int64_t{0})));
    } else if (state == "fetch") {
      out.kind = TrackerManifest::Kind::kFetch;
      out.lease_id = j.value("lease_id", std::string());
    } else if (state == "wait") {
      out.kind = TrackerManifest::Kind::kWait;
      out.retry_after = std::chrono::milliseconds(j.value("retry_after_ms", int64_t{500}));
    } else if (state == "missing") {
      out.kind = TrackerManifest::Kind::kMissing;
      out.missing = j.value("error", std::string("not found upstream"));
      out.age = std::chrono::milliseconds(std::max<int64_t>(0, j.value("age_ms", int64_t{0})));
    } else {
      return MakeError(ErrorCode::kProtocol, "tracker manifest state \"" + state + "\" unknown");
    }
    return out;
  } catch (const std::exception& e) {
    return MakeError(ErrorCode::kProtocol, std::string("tracker manifest answer: ") + e.what());
  }
}

}  // namespace

awaitable<Result<TrackerManifest>> TrackerClient::ResolveManifest(const ManifestRef& ref,
                                                                  std::chrono::milliseconds wait) {
  std::string target = "/v1/manifests/resolve?wait_ms=" + std::to_string(wait.count());
  std::string body = ManifestRefJson(options_.agent_id, ref).dump();
  Digest key = ManifestOwnerKey(ref);
  auto reply = co_await Call(key, http_::verb::post, std::move(target), std::move(body));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200) {
    co_return ReplyError(reply.value().status, reply.value().body,
                         "manifest " + ref.registry + "/" + ref.repository + ":" + ref.reference);
  }
  co_return ParseManifestAnswer(reply.value().body);
}

awaitable<Status> TrackerClient::PublishManifest(const ManifestRef& ref,
                                                 const std::string& lease_id, const Digest& digest,
                                                 const std::string& media_type,
                                                 const std::string& body) {
  json j = ManifestRefJson(options_.agent_id, ref);
  j["lease_id"] = lease_id;
  j["media_type"] = media_type;
  j["manifest"] = Base64Encode(body);
  std::string target = "/v1/manifests/" + digest.str();
  std::string payload = j.dump();
  Digest key = ManifestOwnerKey(ref);
  auto reply = co_await Call(key, http_::verb::put, std::move(target), std::move(payload));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200)
    co_return ReplyError(reply.value().status, reply.value().body, "manifest publish");
  co_return Ok();
}

awaitable<Status> TrackerClient::ReleaseManifest(const ManifestRef& ref,
                                                 const std::string& lease_id,
                                                 const std::string& missing) {
  std::string target = "/v1/manifests/release";
  json j = ManifestRefJson(options_.agent_id, ref);
  j["lease_id"] = lease_id;
  if (!missing.empty()) j["missing"] = missing;
  std::string body = j.dump(-1, ' ', false, json::error_handler_t::replace);
  Digest key = ManifestOwnerKey(ref);
  auto reply = co_await Call(key, http_::verb::post, std::move(target), std::move(body));
  if (!reply) co_return reply.error();
  if (reply.value().status != 200)
    co_return ReplyError(reply.value().status, reply.value().body, "manifest lease release");
  co_return Ok();
}

// ---- Announces in batches ----

awaitable<Result<std::string>> TrackerClient::AnnounceBatch(size_t replica, std::string lines) {
  if (replica >= options_.trackers.size()) {
    co_return MakeError(ErrorCode::kInvalidArgument, "no tracker replica " + std::to_string(replica));
  }
  auto reply = co_await CallReplica(replica, http_::verb::post, "/v1/announces", lines);
  if (!reply) co_return reply.error();
  if (reply.value().status != 200) {
    // The route answers in text lines, its errors too (the JSON of the other routes when the
    // token is refused).
    Error e = ReplyError(reply.value().status, reply.value().body, "announce batch");
    std::string_view text = reply.value().body;
    if (e.message.find('(') == std::string::npos && !text.empty()) {
      text = text.substr(0, std::min<size_t>(text.find('\n'), 200));
      e.message += " (" + std::string(text) + ")";
    }
    co_return e;
  }
  co_return std::move(reply.value().body);
}

// ---- Cluster prefetch jobs ----

awaitable<Result<std::vector<TrackerPrefetchJob>>> TrackerClient::PollPrefetch(
    size_t replica, const std::string& node, const std::map<std::string, std::string>& labels,
    std::chrono::milliseconds wait, uint16_t swarm_port) {
  json labels_json = json::object();
  for (const auto& [k, v] : labels) labels_json[k] = v;
  const std::string body =
      json{{"agent", options_.agent_id}, {"node", node}, {"labels", labels_json}}.dump();
  // In the query: replicas that predate swarm_port ignore it there (they refuse unknown fields).
  std::string target = "/v1/prefetch/poll?wait_ms=" + std::to_string(wait.count());
  if (swarm_port != 0) target += "&swarm_port=" + std::to_string(swarm_port);
  auto reply = co_await CallReplica(replica, http_::verb::post, target, body);
  if (!reply) co_return reply.error();
  if (reply.value().status != 200)
    co_return ReplyError(reply.value().status, reply.value().body, "prefetch poll");
  try {
    json j = json::parse(reply.value().body);
    std::vector<TrackerPrefetchJob> out;
    for (const json& e : j.at("jobs")) {
      TrackerPrefetchJob job;
      job.id = e.at("id").get<std::string>();
      job.images = e.at("images").get<std::vector<std::string>>();
      job.platform = e.value("platform", "linux/amd64");
      job.ttl_s = e.value("ttl_s", int64_t{86400});
      job.parallel = e.value("parallel", 4);
      job.snapshots = e.value("snapshots", false);
      out.push_back(std::move(job));
    }
    co_return out;
  } catch (const std::exception& e) {
    co_return MakeError(ErrorCode::kProtocol,
                        std::string("tracker prefetch poll answer: ") + e.what());
  }
}

awaitable<Status> TrackerClient::ReportPrefetch(size_t replica, const std::string& id,
                                                const std::string& node,
                                                const TrackerPrefetchProgress& p) {
  json j{{"agent", options_.agent_id}, {"state", p.state},
         {"bytes_done", p.bytes_done}, {"bytes_total", p.bytes_total},
         {"blobs_done", p.blobs_done}, {"blobs_total", p.blobs_total}};
  if (!p.error.empty()) j["error"] = p.error.substr(0, 2000);
  const std::string target =
      "/v1/prefetch/jobs/" + http::QueryEscape(id) + "/nodes/" + http::QueryEscape(node);
  const std::string body = j.dump();
  auto reply = co_await CallReplica(replica, http_::verb::put, target, body);
  if (!reply) co_return reply.error();
  if (reply.value().status != 200)
    co_return ReplyError(reply.value().status, reply.value().body, "prefetch report on " + id);
  co_return Ok();
}

}  // namespace shoal::agent
