#include "tracker/prefetch/prefetch_api.h"

#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "lib/core/sha256.h"
#include "lib/oci/reference.h"
#include "tracker/swarms/announce.h"
#include "tracker/request_checks.h"

namespace shoal::tracker {
namespace http = boost::beast::http;
using nlohmann::json;

namespace {

constexpr std::string_view kPrefix = "/v1/prefetch";
constexpr size_t kMaxAgentBytes = 128;
constexpr size_t kMaxNodeBytes = 253;  // a Kubernetes node name
constexpr size_t kMaxLabels = 64;
constexpr size_t kMaxLabelBytes = 317;  // prefix/name (253 + 1 + 63)
constexpr size_t kMaxImages = 64;
constexpr size_t kMaxImageBytes = 1024;
constexpr size_t kMaxNodes = 10'000;
constexpr size_t kMaxErrorBytes = 2048;
constexpr size_t kMaxJobIdBytes = 64;
constexpr std::chrono::milliseconds kJobRecheck{1000};  // long-polled job reads sweep this often

enum class Route { kCreate, kList, kGet, kReport, kPoll, kAgents, kUnknown };

std::string_view RouteName(Route route) {
  switch (route) {
    case Route::kCreate:
      return "create";
    case Route::kList:
      return "list";
    case Route::kGet:
      return "get";
    case Route::kReport:
      return "report";
    case Route::kPoll:
      return "poll";
    case Route::kAgents:
      return "agents";
    case Route::kUnknown:
      break;
  }
  return "other";
}

int64_t Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// LeaseWaiters is keyed by digest: park on a digest of what the waiter waits for.
Digest NodeKey(const std::string& node) { return Sha256::Of("prefetch-node|" + node); }
Digest JobKey(const std::string& id) { return Sha256::Of("prefetch-job|" + id); }

std::optional<Rejection> CheckLabel(std::string_view what, std::string_view text) {
  if (text.size() > kMaxLabelBytes || HasControlChars(text) ||
      text.find_first_of("=,") != std::string_view::npos) {
    return Rejection{400, std::string(what) + " " + Quoted(text) + " must be at most " +
                              std::to_string(kMaxLabelBytes) +
                              " printable characters without '=' or ','"};
  }
  return std::nullopt;
}

// {"k":"v"} or "k=v,k2=v2" (the form --node-labels and --selector take).
std::optional<Rejection> ParseLabels(const json& j, const char* field,
                                     std::map<std::string, std::string>& out) {
  auto add = [&](const std::string& k, const std::string& v) -> std::optional<Rejection> {
    if (k.empty()) return Rejection{400, std::string("\"") + field + "\" has an empty label key"};
    if (auto r = CheckLabel(std::string("\"") + field + "\" key", k)) return r;
    if (auto r = CheckLabel(std::string("\"") + field + "\" value", v)) return r;
    out[k] = v;
    return std::nullopt;
  };
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      if (!v.is_string()) {
        return Rejection{
            400, std::string("\"") + field + "\" value of " + Quoted(k) + " must be a string"};
      }
      if (auto r = add(k, v.get<std::string>())) return r;
    }
  } else if (j.is_string()) {
    std::string_view text = j.get_ref<const std::string&>();
    while (!text.empty()) {
      size_t comma = text.find(',');
      std::string_view kv = text.substr(0, comma);
      text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
      if (kv.empty()) continue;
      size_t eq = kv.find('=');
      if (eq == std::string_view::npos) {
        return Rejection{
            400, std::string("\"") + field + "\" entry " + Quoted(kv) + " is not KEY=VALUE"};
      }
      if (auto r = add(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)))) return r;
    }
  } else {
    return Rejection{
        400, std::string("\"") + field + "\" must be an object of strings or a \"k=v,...\" string"};
  }
  if (out.size() > kMaxLabels) {
    return Rejection{
        400, fmt::format("\"{}\" has {} labels, more than {}", field, out.size(), kMaxLabels)};
  }
  return std::nullopt;
}

std::optional<Rejection> StringList(const Body& body, const char* field, size_t max_items,
                                    size_t max_bytes, std::vector<std::string>& out) {
  const json* j = body.Find(field);
  if (!j) return std::nullopt;
  if (!j->is_array())
    return Rejection{400, std::string("\"") + field + "\" must be an array of strings"};
  if (j->size() > max_items) {
    return Rejection{
        400, fmt::format("\"{}\" has {} entries, more than {}", field, j->size(), max_items)};
  }
  for (const auto& e : *j) {
    if (!e.is_string()) {
      return Rejection{400, std::string("\"") + field + "\" must be an array of strings"};
    }
    const auto& s = e.get_ref<const std::string&>();
    if (auto r = CheckId(std::string("an entry of \"") + field + "\"", s, max_bytes)) return r;
    out.push_back(s);
  }
  return std::nullopt;
}

std::optional<Rejection> OptionalUnsigned(const Body& body, const char* field, uint64_t max,
                                          std::optional<uint64_t>& out) {
  if (!body.Find(field)) return std::nullopt;
  uint64_t v = 0;
  if (auto r = body.Unsigned(field, v)) return r;
  if (v > max) return Rejection{400, fmt::format("\"{}\" is {}, more than {}", field, v, max)};
  out = v;
  return std::nullopt;
}

std::optional<Rejection> UnknownFields(const std::string_view text,
                                       std::initializer_list<std::string_view> known) {
  json j = json::parse(text, nullptr, false);
  for (const auto& [k, v] : j.items()) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      return Rejection{400, "unknown field " + Quoted(k)};
    }
  }
  return std::nullopt;
}

std::optional<PrefetchNodeState> ParseState(std::string_view s) {
  if (s == "running") return PrefetchNodeState::kRunning;
  if (s == "done") return PrefetchNodeState::kDone;
  if (s == "failed") return PrefetchNodeState::kFailed;
  return std::nullopt;
}

}  // namespace

json PrefetchNodeJson(const PrefetchNode& n, TimePoint now) {
  json j = {{"node", n.node},
            {"state", PrefetchNodeStateName(n.state)},
            {"bytes_done", n.bytes_done},
            {"bytes_total", n.bytes_total},
            {"blobs_done", n.blobs_done},
            {"blobs_total", n.blobs_total},
            {"elapsed_ms", n.started ? Ms((n.ended ? *n.ended : now) - *n.started) : 0}};
  if (!n.agent.empty()) j["agent"] = n.agent;
  if (!n.error.empty()) j["error"] = n.error;
  return j;
}

json PrefetchJobJson(const PrefetchJobRecord& job, TimePoint now, bool with_nodes) {
  size_t counts[4] = {0, 0, 0, 0};
  uint64_t bytes_done = 0, bytes_total = 0;
  json nodes = json::array();
  for (const auto& n : job.nodes) {
    ++counts[static_cast<int>(n.state)];
    bytes_done += n.bytes_done;
    bytes_total += n.bytes_total;
    if (with_nodes) nodes.push_back(PrefetchNodeJson(n, now));
  }
  json selector = json::object();
  for (const auto& [k, v] : job.spec.selector) selector[k] = v;
  json j = {{"id", job.id},
            {"state", !job.ended ? "running"
                      : job.ok   ? "done"
                                 : "failed"},
            {"images", job.spec.images},
            {"platform", job.spec.platform},
            {"ttl_s", job.spec.ttl_s},
            {"parallel", job.spec.parallel},
            {"snapshots", job.spec.snapshots},
            {"selector", selector},
            {"elapsed_ms", Ms((job.ended ? *job.ended : now) - job.created)},
            {"version", job.version},
            {"totals",
             {{"nodes", job.nodes.size()},
              {"pending", counts[0]},
              {"running", counts[1]},
              {"done", counts[2]},
              {"failed", counts[3]},
              {"bytes_done", bytes_done},
              {"bytes_total", bytes_total}}}};
  if (!job.spec.nodes.empty()) j["nodes_requested"] = job.spec.nodes;
  if (job.spec.percent) j["percent"] = *job.spec.percent;
  if (job.deadline) j["timeout_ms"] = Ms(*job.deadline - job.created);
  if (with_nodes) j["nodes"] = nodes;
  if (job.ended && !job.ok) {
    j["error"] = fmt::format("{} of {} nodes failed", counts[3], job.nodes.size());
  }
  return j;
}


// A validated request.
struct PrefetchApi::Call {
  Route route = Route::kUnknown;
  std::chrono::milliseconds wait{0};
  uint64_t since = 0;
  std::string id;
  std::string node;
  std::string agent;
  std::map<std::string, std::string> labels;
  // A poll's swarm endpoint: its TCP source address and the swarm_port it reported.
  std::optional<PeerEndpoint> peer;
  PrefetchSpec spec;
  PrefetchReport report;
};

namespace {

std::optional<Rejection> ParseCreate(const Body& body, std::string_view text, PrefetchSpec& spec) {
  if (auto r = UnknownFields(text, {"images", "platform", "ttl_s", "parallel", "snapshots", "nodes",
                                    "selector", "percent", "timeout_s"}))
    return r;
  if (!body.Find("images")) return Rejection{400, "request body has no \"images\" field"};
  if (auto r = StringList(body, "images", kMaxImages, kMaxImageBytes, spec.images)) return r;
  if (spec.images.empty()) return Rejection{400, "\"images\" is empty; name at least one image"};
  for (const auto& image : spec.images) {
    auto ref = oci::ParseImageRef(image);
    if (!ref) {
      return Rejection{
          400, "image " + Quoted(image) + " is not a valid reference: " + ref.error().message};
    }
  }
  if (auto r = body.String("platform", false, 64, spec.platform)) return r;
  auto slash = spec.platform.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == spec.platform.size() ||
      HasControlChars(spec.platform)) {
    return Rejection{400, "\"platform\" " + Quoted(spec.platform) + " is not os/arch"};
  }
  std::optional<uint64_t> ttl, parallel, percent, timeout;
  if (auto r = OptionalUnsigned(body, "ttl_s", 10ull * 365 * 86400, ttl)) return r;
  if (ttl) spec.ttl_s = static_cast<int64_t>(*ttl);
  if (auto r = OptionalUnsigned(body, "parallel", 32, parallel)) return r;
  if (parallel) {
    if (*parallel == 0) return Rejection{400, "\"parallel\" must be 1..32"};
    spec.parallel = static_cast<int>(*parallel);
  }
  if (const json* snapshots = body.Find("snapshots")) {
    if (!snapshots->is_boolean()) return Rejection{400, "\"snapshots\" must be true or false"};
    spec.snapshots = snapshots->get<bool>();
  }
  if (auto r = OptionalUnsigned(body, "percent", 100, percent)) return r;
  if (percent) {
    if (*percent == 0) return Rejection{400, "\"percent\" must be 1..100"};
    spec.percent = static_cast<int>(*percent);
  }
  if (auto r = OptionalUnsigned(body, "timeout_s", 30ull * 86400, timeout)) return r;
  if (timeout && *timeout > 0) spec.timeout = std::chrono::seconds(*timeout);
  if (auto r = StringList(body, "nodes", kMaxNodes, kMaxNodeBytes, spec.nodes)) return r;
  if (const json* sel = body.Find("selector")) {
    if (auto r = ParseLabels(*sel, "selector", spec.selector)) return r;
  }
  return std::nullopt;
}

std::optional<Rejection> ParseRequest(const BlobRequest& req, std::chrono::milliseconds max_wait,
                                      PrefetchApi::Call& call) {
  auto method = [&](http::verb want, std::string_view allow) -> std::optional<Rejection> {
    if (req.method == want || (want == http::verb::get && req.method == http::verb::head))
      return std::nullopt;
    return Rejection{
        405,
        std::string(http::to_string(req.method)) + " is not supported; use " + std::string(allow),
        allow};
  };
  std::string_view rest = req.path.substr(std::min(req.path.size(), kPrefix.size()));
  std::map<std::string, std::string> query;
  if (auto r = ParseQuery(req.query, query)) return r;
  auto wait = [&]() -> std::optional<Rejection> {
    auto it = query.find("wait_ms");
    if (it == query.end()) return std::nullopt;
    auto v = ParseDecimal(it->second, 9);
    if (!v)
      return Rejection{400, "wait_ms " + Quoted(it->second) + " is not a non-negative integer"};
    call.wait = std::min(std::chrono::milliseconds(static_cast<int64_t>(*v)), max_wait);
    return std::nullopt;
  };
  if (rest == "/jobs") {
    if (req.method == http::verb::post) {
      call.route = Route::kCreate;
      Body body;
      if (auto r = Body::Parse(req.body, body)) return r;
      return ParseCreate(body, req.body, call.spec);
    }
    call.route = Route::kList;
    return method(http::verb::get, "GET, POST");
  }
  if (rest == "/poll") {
    call.route = Route::kPoll;
    if (auto r = method(http::verb::post, "POST")) return r;
    if (auto r = wait()) return r;
    // The swarm's port is a query parameter, not a body field: replicas that predate it refuse
    // unknown body fields but ignore unknown query parameters, so a newer agent still polls them.
    if (auto it = query.find("swarm_port"); it != query.end()) {
      auto v = ParseDecimal(it->second, 5);
      if (!v || *v == 0 || *v > 65535) {
        return Rejection{400, "swarm_port " + Quoted(it->second) + " is not a port (1 to 65535)"};
      }
      call.peer = PeerEndpoint::FromAddress(req.remote, static_cast<uint16_t>(*v));
    }
    Body body;
    if (auto r = Body::Parse(req.body, body)) return r;
    if (auto r = UnknownFields(req.body, {"agent", "node", "labels"})) return r;
    if (auto r = body.String("agent", true, kMaxAgentBytes, call.agent)) return r;
    if (auto r = CheckId("\"agent\"", call.agent, kMaxAgentBytes)) return r;
    if (auto r = body.String("node", true, kMaxNodeBytes, call.node)) return r;
    if (auto r = CheckId("\"node\"", call.node, kMaxNodeBytes)) return r;
    if (const json* labels = body.Find("labels")) {
      if (auto r = ParseLabels(*labels, "labels", call.labels)) return r;
    }
    return std::nullopt;
  }
  if (rest == "/agents") {
    call.route = Route::kAgents;
    return method(http::verb::get, "GET");
  }
  if (rest.starts_with("/jobs/")) {
    std::string_view tail = rest.substr(6);
    size_t slash = tail.find('/');
    auto id = PercentDecode(tail.substr(0, slash), "job id");
    if (!id) return Rejection{400, id.error().message};
    if (auto r = CheckId("job id", id.value(), kMaxJobIdBytes)) return r;
    call.id = id.value();
    if (slash == std::string_view::npos) {
      call.route = Route::kGet;
      if (auto r = method(http::verb::get, "GET")) return r;
      if (auto r = wait()) return r;
      if (auto it = query.find("since"); it != query.end()) {
        auto v = ParseDecimal(it->second, 19);
        if (!v)
          return Rejection{400, "since " + Quoted(it->second) + " is not a non-negative integer"};
        call.since = *v;
      }
      return std::nullopt;
    }
    std::string_view node_part = tail.substr(slash);
    if (!node_part.starts_with("/nodes/") || node_part.size() == 7) {
      return Rejection{404, "no such prefetch endpoint (want /v1/prefetch/jobs/{id}/nodes/{node})"};
    }
    call.route = Route::kReport;
    if (auto r = method(http::verb::put, "PUT")) return r;
    auto node = PercentDecode(node_part.substr(7), "node");
    if (!node) return Rejection{400, node.error().message};
    if (auto r = CheckId("node", node.value(), kMaxNodeBytes)) return r;
    call.node = node.value();
    Body body;
    if (auto r = Body::Parse(req.body, body)) return r;
    if (auto r = UnknownFields(req.body, {"agent", "state", "error", "bytes_done", "bytes_total",
                                          "blobs_done", "blobs_total"}))
      return r;
    PrefetchReport& rep = call.report;
    if (auto r = body.String("agent", true, kMaxAgentBytes, rep.agent)) return r;
    if (auto r = CheckId("\"agent\"", rep.agent, kMaxAgentBytes)) return r;
    std::string state;
    if (auto r = body.String("state", true, 16, state)) return r;
    auto parsed = ParseState(state);
    if (!parsed) {
      return Rejection{400, "\"state\" " + Quoted(state) + " is not running, done or failed"};
    }
    rep.state = *parsed;
    if (auto r = body.String("error", false, kMaxErrorBytes, rep.error)) return r;
    if (rep.state == PrefetchNodeState::kFailed && rep.error.empty()) {
      return Rejection{400, "a \"failed\" report needs an \"error\""};
    }
    std::optional<uint64_t> v;
    for (auto [name, out] :
         {std::pair{"bytes_done", &rep.bytes_done}, std::pair{"bytes_total", &rep.bytes_total},
          std::pair{"blobs_done", &rep.blobs_done}, std::pair{"blobs_total", &rep.blobs_total}}) {
      v.reset();
      if (auto r = OptionalUnsigned(body, name, UINT64_MAX, v)) return r;
      if (v) *out = *v;
    }
    if (rep.bytes_done > rep.bytes_total || rep.blobs_done > rep.blobs_total) {
      return Rejection{400, "\"bytes_done\" and \"blobs_done\" must not exceed their totals"};
    }
    return std::nullopt;
  }
  return Rejection{404,
                   "no such prefetch endpoint (want /v1/prefetch/jobs, /v1/prefetch/poll "
                   "or /v1/prefetch/agents)"};
}

}  // namespace

PrefetchApi::PrefetchApi(PrefetchApiOptions options, prometheus::Registry& registry,
                         std::string tracker_id, uint64_t seed)
    : options_(std::move(options)),
      tracker_id_(std::move(tracker_id)),
      jobs_(options_.jobs, seed),
      requests_(prometheus::BuildCounter()
                    .Name("shoal_tracker_prefetch_requests_total")
                    .Help("Prefetch API requests, by route and status")
                    .Register(registry)),
      created_(prometheus::BuildCounter()
                   .Name("shoal_tracker_prefetch_jobs_created_total")
                   .Help("Prefetch jobs created")
                   .Register(registry)
                   .Add({})),
      job_gauge_(prometheus::BuildGauge()
                     .Name("shoal_tracker_prefetch_jobs")
                     .Help("Prefetch jobs kept, by state (running, done, failed)")
                     .Register(registry)),
      node_gauge_(prometheus::BuildGauge()
                      .Name("shoal_tracker_prefetch_nodes")
                      .Help("Nodes' parts of the prefetch jobs kept, by state")
                      .Register(registry)),
      agents_(prometheus::BuildGauge()
                  .Name("shoal_tracker_prefetch_agents")
                  .Help("Agents that polled for prefetch jobs within the agent TTL")
                  .Register(registry)
                  .Add({})),
      job_nodes_(prometheus::BuildGauge()
                     .Name("shoal_tracker_prefetch_job_nodes")
                     .Help("Nodes of a prefetch job by state (pending, running, done, failed); "
                           "the 10 newest jobs only")
                     .Register(registry)),
      job_bytes_(prometheus::BuildGauge()
                     .Name("shoal_tracker_prefetch_job_bytes")
                     .Help("Bytes of a prefetch job over its nodes, by kind (done, total); the "
                           "10 newest jobs only")
                     .Register(registry)) {}

bool PrefetchApi::Owns(std::string_view path) {
  return path == kPrefix ||
         (path.size() > kPrefix.size() && path.substr(0, kPrefix.size()) == kPrefix &&
          path[kPrefix.size()] == '/');
}

void PrefetchApi::Wake(const std::vector<std::string>& job_ids) {
  for (const auto& id : job_ids) waiters_.WakeBlob(JobKey(id));
}

void PrefetchApi::MaybeSweep(TimePoint now) {
  if (now - last_sweep_ < std::chrono::seconds(1)) return;
  Sweep(now);
}

boost::asio::awaitable<BlobResponse> PrefetchApi::Handle(BlobRequest req) {
  Call call;
  if (auto rejected = ParseRequest(req, options_.max_wait, call)) {
    BlobResponse response = Error(rejected->status, std::move(rejected->message));
    response.allow = rejected->allow;
    Count(response, RouteName(call.route));
    co_return response;
  }
  if (stopping_ && call.route == Route::kPoll) {
    // Agents back off on an error; an empty answer would have them poll again at once.
    BlobResponse response = Error(503, "the tracker is shutting down");
    Count(response, RouteName(call.route));
    co_return response;
  }
  MaybeSweep(TrackerClock::now());
  const TimePoint deadline = TrackerClock::now() + call.wait;
  if (call.route == Route::kPoll && call.wait.count() > 0) {
    // Register first, so a job created meanwhile selects this agent.
    std::vector<std::string> changed;
    if (auto err = jobs_.Heartbeat(call.node, call.agent, call.labels, TrackerClock::now(),
                                   &changed, call.peer)) {
      BlobResponse response = Error(503, err->message);
      Count(response, RouteName(call.route));
      co_return response;
    }
    Wake(changed);
    while (!jobs_.HasPending(call.node) && !stopping_ && waiters_.size() < options_.max_waiters &&
           TrackerClock::now() < deadline) {
      co_await waiters_.Wait(NodeKey(call.node), false, deadline);
    }
  } else if (call.route == Route::kGet && call.wait.count() > 0) {
    for (;;) {
      const TimePoint now = TrackerClock::now();
      MaybeSweep(now);
      const PrefetchJobRecord* job = jobs_.Find(call.id);
      if (!job || job->version > call.since || stopping_ || now >= deadline ||
          waiters_.size() >= options_.max_waiters) {
        break;
      }
      // Woken by a change, or after a while to sweep (gone agents, the job's deadline).
      co_await waiters_.Wait(JobKey(call.id), false, std::min(deadline, now + kJobRecheck));
    }
  }
  BlobResponse response = Execute(call, TrackerClock::now());
  Count(response, RouteName(call.route));
  co_return response;
}

BlobResponse PrefetchApi::HandleNow(const BlobRequest& req, TimePoint now) {
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

BlobResponse PrefetchApi::Execute(const Call& call, TimePoint now) {
  switch (call.route) {
    case Route::kCreate: {
      auto created = jobs_.Create(call.spec, now);
      if (auto* err = std::get_if<PrefetchError>(&created)) {
        return Error(err->code == PrefetchErrc::kNoNodes ? 409 : 503, err->message);
      }
      const PrefetchJobRecord* job = std::get<const PrefetchJobRecord*>(created);
      created_.Increment();
      spdlog::info("prefetch job {}: {} images on {} nodes", job->id, job->spec.images.size(),
                   job->nodes.size());
      for (const auto& n : job->nodes) waiters_.WakeBlob(NodeKey(n.node));
      return Json(201, PrefetchJobJson(*job, now, true));
    }
    case Route::kList: {
      json list = json::array();
      for (const auto* job : jobs_.List()) list.push_back(PrefetchJobJson(*job, now, false));
      return Json(200, json{{"jobs", list}});
    }
    case Route::kGet: {
      const PrefetchJobRecord* job = jobs_.Find(call.id);
      if (!job) return Error(404, "no prefetch job " + Quoted(call.id) + " on this tracker");
      return Json(200, PrefetchJobJson(*job, now, true));
    }
    case Route::kReport: {
      if (auto err = jobs_.Report(call.id, call.node, call.report, now)) {
        return Error(err->code == PrefetchErrc::kNotFound ? 404 : 409, err->message);
      }
      Wake({call.id});
      const PrefetchJobRecord* job = jobs_.Find(call.id);
      return Json(200, json{{"job_state", !job->ended ? "running" : job->ok ? "done" : "failed"}});
    }
    case Route::kPoll: {
      std::vector<std::string> changed;
      if (auto err =
              jobs_.Heartbeat(call.node, call.agent, call.labels, now, &changed, call.peer)) {
        return Error(503, err->message);
      }
      std::vector<PrefetchAssignment> taken = jobs_.Take(call.node, call.agent, now);
      json list = json::array();
      for (const auto& a : taken) {
        changed.push_back(a.id);
        list.push_back(json{{"id", a.id},
                            {"images", a.images},
                            {"platform", a.platform},
                            {"ttl_s", a.ttl_s},
                            {"parallel", a.parallel},
                            {"snapshots", a.snapshots}});
      }
      Wake(changed);
      return Json(200, json{{"jobs", list}, {"agent_ttl_ms", Ms(options_.jobs.agent_ttl)}});
    }
    case Route::kAgents: {
      json list = json::array();
      for (const auto& a : jobs_.LiveAgents(now)) {
        json labels = json::object();
        for (const auto& [k, v] : a.labels) labels[k] = v;
        list.push_back(json{{"node", a.node},
                            {"agent", a.agent},
                            {"labels", labels},
                            {"last_seen_ms", Ms(now - a.last_seen)}});
      }
      return Json(200, json{{"agents", list}});
    }
    case Route::kUnknown:
      break;
  }
  return Error(404, "no such prefetch endpoint");
}

BlobResponse PrefetchApi::Json(unsigned status, json body) const {
  body["tracker_id"] = tracker_id_;
  BlobResponse response;
  response.status = status;
  response.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return response;
}

BlobResponse PrefetchApi::Error(unsigned status, std::string message) const {
  return Json(status, json{{"error", std::move(message)}});
}

void PrefetchApi::Count(const BlobResponse& response, std::string_view route) {
  requests_.Add({{"route", std::string(route)}, {"code", std::to_string(response.status)}})
      .Increment();
}

void PrefetchApi::Shutdown() {
  stopping_ = true;
  waiters_.WakeAll();
}

void PrefetchApi::Sweep(TimePoint now) {
  last_sweep_ = now;
  Wake(jobs_.Sweep(now));
  double running = 0, done = 0, failed = 0;
  double nodes[4] = {0, 0, 0, 0};
  for (const auto* job : jobs_.List()) {
    if (!job->ended) {
      ++running;
    } else if (job->ok) {
      ++done;
    } else {
      ++failed;
    }
    for (const auto& n : job->nodes) ++nodes[static_cast<int>(n.state)];
  }
  job_gauge_.Add({{"state", "running"}}).Set(running);
  job_gauge_.Add({{"state", "done"}}).Set(done);
  job_gauge_.Add({{"state", "failed"}}).Set(failed);
  for (int s = 0; s < 4; ++s) {
    node_gauge_.Add({{"state", PrefetchNodeStateName(static_cast<PrefetchNodeState>(s))}})
        .Set(nodes[s]);
  }
  agents_.Set(static_cast<double>(jobs_.LiveAgents(now).size()));
  UpdateJobGauges();
}

void PrefetchApi::UpdateJobGauges() {
  std::map<std::string, const PrefetchJobRecord*> newest;  // List() is newest first
  for (const auto* job : jobs_.List()) {
    if (newest.size() >= kJobGauges) break;
    newest.emplace(job->id, job);
  }
  // Series of jobs no longer among them go, so the label set stays bounded.
  for (auto it = job_series_.begin(); it != job_series_.end();) {
    if (newest.count(it->first)) {
      ++it;
      continue;
    }
    for (size_t i = 0; i < it->second.size(); ++i) {
      (i < 4 ? job_nodes_ : job_bytes_).Remove(it->second[i]);
    }
    it = job_series_.erase(it);
  }
  for (const auto& [id, job] : newest) {
    double states[4] = {0, 0, 0, 0};
    double done = 0, total = 0;
    for (const auto& n : job->nodes) {
      ++states[static_cast<int>(n.state)];
      done += static_cast<double>(n.bytes_done);
      total += static_cast<double>(n.bytes_total);
    }
    auto& series = job_series_[id];
    if (series.empty()) {
      for (int st = 0; st < 4; ++st) {
        series.push_back(&job_nodes_.Add(
            {{"prefetch_job", id},
             {"state", PrefetchNodeStateName(static_cast<PrefetchNodeState>(st))}}));
      }
      series.push_back(&job_bytes_.Add({{"prefetch_job", id}, {"kind", "done"}}));
      series.push_back(&job_bytes_.Add({{"prefetch_job", id}, {"kind", "total"}}));
    }
    for (int st = 0; st < 4; ++st) series[st]->Set(states[st]);
    series[4]->Set(done);
    series[5]->Set(total);
  }
}

std::string PrefetchApi::StatusSection(TimePoint now) const {
  std::string out = fmt::format("prefetch: {} agents live (ttl {} s); {} jobs kept, {} running\n",
                                jobs_.LiveAgents(now).size(), options_.jobs.agent_ttl.count(),
                                jobs_.job_count(), jobs_.running_jobs());
  for (const auto* job : jobs_.List()) {
    json j = PrefetchJobJson(*job, now, false);
    out += fmt::format("  {} {} {} nodes ({} done, {} failed) {}\n", job->id,
                       j["state"].get<std::string>(), job->nodes.size(),
                       j["totals"]["done"].get<size_t>(), j["totals"]["failed"].get<size_t>(),
                       fmt::join(job->spec.images, " "));
  }
  return out;
}

}  // namespace shoal::tracker
