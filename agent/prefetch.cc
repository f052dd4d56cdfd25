#include "agent/prefetch.h"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

#include "agent/admin.h"
#include "lib/oci/reference.h"

namespace shoal::agent {
namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;

namespace {

constexpr std::string_view kPrefix = "/shoal/v1/prefetch";
constexpr char kPinOwner[] = "prefetch";
constexpr std::chrono::milliseconds kMaxWait{30'000};

std::string_view BlobStateName(PrefetchBlob::State s) {
  switch (s) {
    case PrefetchBlob::State::kWaiting:
      return "waiting";
    case PrefetchBlob::State::kFetching:
      return "fetching";
    case PrefetchBlob::State::kDone:
      return "done";
    case PrefetchBlob::State::kFailed:
      return "failed";
  }
  return "failed";
}

std::string_view JobStateName(PrefetchJob::State s) {
  switch (s) {
    case PrefetchJob::State::kRunning:
      return "running";
    case PrefetchJob::State::kDone:
      return "done";
    case PrefetchJob::State::kFailed:
      return "failed";
  }
  return "failed";
}

bool ValidPlatform(const std::string& p) {
  auto slash = p.find('/');
  return slash != std::string::npos && slash > 0 && slash + 1 < p.size() && p.size() <= 64;
}

std::optional<int64_t> ParseCount(const std::string& text) {
  if (text.empty() || text.size() > 12) return std::nullopt;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace

json PrefetchJob::ToJson() const {
  json images_json = json::array();
  size_t layers = 0, prepared = 0, layers_failed = 0;
  for (const auto& i : images) {
    json j = {{"ref", i.ref}, {"resolved", i.resolved}};
    if (!i.digest.empty()) j["digest"] = i.digest;
    if (!i.error.empty()) j["error"] = i.error;
    if (i.snapshots) {
      const snapshotter::StageProgress& p = *i.snapshots;
      j["snapshots"] = {
          {"layers", p.layers}, {"prepared", p.prepared}, {"failed", p.failed}, {"done", p.done}};
      if (!p.error.empty()) j["snapshots"]["error"] = p.error;
      layers += p.layers;
      prepared += p.prepared;
      layers_failed += p.failed;
    }
    images_json.push_back(j);
  }
  json blobs_json = json::array();
  uint64_t bytes_total = 0, bytes_done = 0;
  size_t done = 0, failed = 0;
  for (const auto& b : blobs) {
    json j = {{"digest", b.digest.str()}, {"image", b.image}, {"kind", b.kind},
              {"size", b.size},           {"done", b.done},   {"state", BlobStateName(b.state)}};
    if (!b.error.empty()) j["error"] = b.error;
    blobs_json.push_back(j);
    bytes_total += b.size;
    bytes_done += b.done;
    done += b.state == PrefetchBlob::State::kDone;
    failed += b.state == PrefetchBlob::State::kFailed;
  }
  auto now = ended ? *ended : std::chrono::system_clock::now();
  json out = {
      {"id", id},
      {"state", JobStateName(state)},
      {"platform", request.platform},
      {"ttl_s", request.ttl.count()},
      {"images", images_json},
      {"blobs", blobs_json},
      {"bytes_total", bytes_total},
      {"bytes_done", bytes_done},
      {"blobs_total", blobs.size()},
      {"blobs_done", done},
      {"blobs_failed", failed},
      {"started_ms", UnixMs(started)},
      {"elapsed_ms", std::chrono::duration_cast<std::chrono::milliseconds>(now - started).count()},
      {"version", version}};
  if (request.snapshots) {
    out["snapshots"] = {{"layers", layers}, {"prepared", prepared}, {"failed", layers_failed}};
  }
  if (ended) out["ended_ms"] = UnixMs(*ended);
  if (!error.empty()) out["error"] = error;
  return out;
}

Prefetcher::Prefetcher(asio::io_context& ioc, PullThrough& pull_through, store::BlobStore& store,
                       PrefetchOptions options)
    : ioc_(ioc),
      pull_through_(pull_through),
      store_(store),
      options_(options),
      changes_(ioc.get_executor()) {}

bool Prefetcher::Owns(const std::string& target) {
  std::string_view path(target);
  path = path.substr(0, path.find('?'));
  return path == kPrefix ||
         (path.size() > kPrefix.size() && path.starts_with(kPrefix) && path[kPrefix.size()] == '/');
}

bool Prefetcher::MakeRoom() {
  auto now = std::chrono::steady_clock::now();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const PrefetchJob& j = *it->second;
    if (j.ended && now - j.ended_steady > options_.keep_ended) {
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  while (jobs_.size() >= options_.max_jobs) {
    auto oldest = jobs_.end();
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      if (!it->second->ended) continue;
      if (oldest == jobs_.end() || *it->second->ended < *oldest->second->ended) oldest = it;
    }
    if (oldest == jobs_.end()) return false;
    jobs_.erase(oldest);
  }
  return true;
}

Result<std::string> Prefetcher::Start(PrefetchRequest request, std::string id,
                                      std::function<void(const PrefetchJob&)> on_change) {
  if (request.images.empty()) {
    return MakeError(ErrorCode::kInvalidArgument, "prefetch needs at least one image (ref=IMAGE)");
  }
  if (!ValidPlatform(request.platform)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "platform \"" + request.platform + "\" is not os/arch (e.g. linux/amd64)");
  }
  if (request.parallel < 1 || request.parallel > 32) {
    return MakeError(ErrorCode::kInvalidArgument, "parallel must be between 1 and 32");
  }
  if (request.ttl.count() < 0) {
    return MakeError(ErrorCode::kInvalidArgument, "ttl must not be negative");
  }
  if (request.snapshots && !layer_prep_) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "snapshots: this agent prepares no containerd snapshots (start it with "
                     "--snapshotter-socket, without --snapshotter-no-prepare)");
  }
  if (id.empty()) id = fmt::format("pf-{:012x}", rng_() & 0xffffffffffffull);
  if (jobs_.count(id)) {
    return MakeError(ErrorCode::kInvalidArgument, "prefetch job " + id + " exists already");
  }
  if (!MakeRoom()) {
    return MakeError(ErrorCode::kUnavailable,
                     fmt::format("{} prefetch jobs are running; try again later", jobs_.size()));
  }
  auto job = std::make_shared<PrefetchJob>();
  job->id = id;
  job->request = std::move(request);
  job->started = std::chrono::system_clock::now();
  job->on_change = std::move(on_change);
  for (const auto& ref : job->request.images) job->images.push_back({ref, "", "", false});
  jobs_.emplace(id, job);
  spdlog::info("prefetch {}: {} images for {}", id, job->images.size(), job->request.platform);
  asio::co_spawn(ioc_, Run(job), asio::detached);
  return id;
}

std::shared_ptr<const PrefetchJob> Prefetcher::Find(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

void Prefetcher::Changed(PrefetchJob& job) {
  ++job.version;
  changes_.NotifyAll();
  if (job.on_change) job.on_change(job);
}

awaitable<void> Prefetcher::Run(std::shared_ptr<PrefetchJob> job) {
  // Resolve and pin every image first: pins may name blobs not cached yet, so eviction spares
  // what this job has fetched while it fetches the rest.
  std::optional<std::chrono::seconds> ttl;
  if (job->request.ttl.count() > 0) ttl = job->request.ttl;
  // Run itself counts as a stage until the workers start: a Stage that ends while an image
  // is still being resolved does not end the job.
  ++job->stages;
  for (size_t index = 0; index < job->images.size(); ++index) {
    PrefetchJob::Image& image = job->images[index];
    auto resolved = co_await pull_through_.ResolveImage(image.ref, job->request.platform);
    if (!resolved) {
      image.error = resolved.error().ToString();
      spdlog::warn("prefetch {}: {}: {}", job->id, image.ref, image.error);
      Changed(*job);
      continue;
    }
    const ResolvedImage& r = resolved.value();
    image.resolved = true;
    image.digest = r.manifests.front().str();
    const std::vector<Digest> digests = r.Digests();
    // Named strings: GCC 12 frees a temporary in a co_await expression twice.
    const std::string owner = kPinOwner, reason = "prefetch " + image.ref;
    if (Status st = co_await pull_through_.SetPins(digests, true, owner, reason, ttl); !st) {
      image.error = "pin: " + st.error().ToString();
    }
    auto add = [&](const oci::Descriptor& d, const char* kind) {
      for (const auto& b : job->blobs) {
        if (b.digest == d.digest) return;
      }
      PrefetchBlob blob{d.digest, image.ref,
                        kind,     static_cast<uint64_t>(std::max<int64_t>(0, d.size)),
                        0,        PrefetchBlob::State::kWaiting,
                        "",       r.repo};
      job->blobs.push_back(std::move(blob));
    };
    if (r.manifest.config) add(*r.manifest.config, "config");
    for (const auto& l : r.manifest.layers) add(l, "layer");
    if (job->request.snapshots && layer_prep_) {
      // Extracted while the workers below fetch: each layer streams into its extraction.
      image.snapshots = snapshotter::StageProgress{};
      ++job->stages;
      const auto keep = ttl ? *ttl : std::chrono::seconds(std::chrono::hours(24));
      layer_prep_->Stage(image.ref, r.manifests.back(), keep,
                         [this, job, index](const snapshotter::StageProgress& p) {
                           asio::post(ioc_, [this, job, index, p] { OnStage(*job, index, p); });
                         });
    }
    Changed(*job);
  }
  pull_through_.UpdateCacheMetrics();
  const int workers = std::min<int>(job->request.parallel, static_cast<int>(job->blobs.size()));
  job->workers = workers;
  --job->stages;
  if (workers == 0) {
    MaybeFinish(*job);
    co_return;
  }
  for (int i = 0; i < workers; ++i) asio::co_spawn(ioc_, Worker(job), asio::detached);
}

awaitable<void> Prefetcher::Worker(std::shared_ptr<PrefetchJob> job) {
  for (;;) {
    size_t index = job->blobs.size();
    for (size_t i = 0; i < job->blobs.size(); ++i) {
      if (job->blobs[i].state == PrefetchBlob::State::kWaiting) {
        index = i;
        break;
      }
    }
    if (index == job->blobs.size()) break;
    job->blobs[index].state = PrefetchBlob::State::kFetching;
    Changed(*job);
    const shim::RepoRef repo = job->blobs[index].repo;
    const Digest digest = job->blobs[index].digest;
    std::function<void(uint64_t)> progress = [job, index, this](uint64_t done) {
      job->blobs[index].done = done;
      Changed(*job);
    };
    Status st = co_await pull_through_.FetchToCache(repo, digest, progress);
    PrefetchBlob& blob = job->blobs[index];
    if (st) {
      blob.state = PrefetchBlob::State::kDone;
      blob.done = blob.size;
    } else {
      blob.state = PrefetchBlob::State::kFailed;
      blob.error = st.error().ToString();
      spdlog::warn("prefetch {}: blob {} of {}: {}", job->id, digest.str(), blob.image, blob.error);
    }
    Changed(*job);
  }
  --job->workers;
  MaybeFinish(*job);
}

void Prefetcher::OnStage(PrefetchJob& job, size_t index, const snapshotter::StageProgress& p) {
  PrefetchJob::Image& image = job.images[index];
  if (!image.snapshots || image.snapshots->done) return;  // reports from two workers may cross
  image.snapshots = p;
  if (p.done) {
    --job.stages;
    if (p.failed > 0 || !p.error.empty()) {
      spdlog::warn("prefetch {}: {}: {} of {} layers not extracted for containerd: {}", job.id,
                   image.ref, p.failed, p.layers, p.error);
    }
  }
  Changed(job);
  MaybeFinish(job);
}

void Prefetcher::MaybeFinish(PrefetchJob& job) {
  if (job.workers == 0 && job.stages == 0 && !job.ended) Finish(job);
}

void Prefetcher::Finish(PrefetchJob& job) {
  size_t bad_images = 0, bad_blobs = 0;
  for (const auto& i : job.images) {
    bad_images += !i.error.empty() ||
                  (i.snapshots && (i.snapshots->failed > 0 || !i.snapshots->error.empty()));
  }
  for (const auto& b : job.blobs) bad_blobs += b.state == PrefetchBlob::State::kFailed;
  if (bad_images + bad_blobs == 0) {
    job.state = PrefetchJob::State::kDone;
  } else {
    job.state = PrefetchJob::State::kFailed;
    std::string first;
    for (const auto& i : job.images) {
      if (first.empty() && !i.error.empty()) first = i.ref + ": " + i.error;
      if (first.empty() && i.snapshots && !i.snapshots->error.empty()) {
        first = i.ref + ": layers for containerd: " + i.snapshots->error;
      }
    }
    for (const auto& b : job.blobs) {
      if (first.empty() && !b.error.empty()) first = b.digest.str() + ": " + b.error;
    }
    job.error = fmt::format("{} of {} images and {} of {} blobs failed; first: {}", bad_images,
                            job.images.size(), bad_blobs, job.blobs.size(), first);
  }
  job.ended = std::chrono::system_clock::now();
  job.ended_steady = std::chrono::steady_clock::now();
  spdlog::info("prefetch {}: {}{}", job.id, JobStateName(job.state),
               job.error.empty() ? "" : ": " + job.error);
  Changed(job);
}

awaitable<void> Prefetcher::WaitChange(const std::string& id, uint64_t since,
                                       std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto job = Find(id);
    if (!job || job->version > since) co_return;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) co_return;
    std::chrono::steady_clock::duration left = deadline - now;
    co_await changes_.Wait(left);
  }
}

awaitable<shim::AdminReply> Prefetcher::HandleAdmin(const std::string& method,
                                                    const std::string& target) {
  auto parsed = ParseAdminTarget(target);
  if (!parsed) co_return JsonReply(400, {{"error", "malformed query in " + target}});
  const AdminTarget& t = parsed.value();
  if (t.path == kPrefix && method == "POST") {
    PrefetchRequest request;
    request.images = t.List("ref");
    request.platform = t.Param("platform", request.platform);
    if (std::string text = t.Param("ttl"); !text.empty()) {
      auto secs = ParseCount(text);
      if (!secs)
        co_return JsonReply(400, {{"error", "ttl \"" + text + "\" is not a number of seconds"}});
      request.ttl = std::chrono::seconds(*secs);
    }
    if (std::string text = t.Param("parallel"); !text.empty()) {
      auto n = ParseCount(text);
      if (!n || *n > 32)
        co_return JsonReply(400, {{"error", "parallel \"" + text + "\" is not 1..32"}});
      request.parallel = static_cast<int>(*n);
    }
    if (std::string text = t.Param("snapshots"); !text.empty()) {
      if (text != "0" && text != "1" && text != "true" && text != "false") {
        co_return JsonReply(400, {{"error", "snapshots \"" + text + "\" is not 0 or 1"}});
      }
      request.snapshots = text == "1" || text == "true";
    }
    for (const auto& ref : request.images) {
      if (auto r = oci::ParseImageRef(ref); !r) {
        co_return JsonReply(400, {{"error", "ref \"" + ref + "\": " + r.error().message}});
      }
    }
    auto id = Start(std::move(request));
    if (!id) co_return ErrorReply(id.error());
    co_return JsonReply(202, Find(id.value())->ToJson());
  }
  if (t.path == kPrefix && method == "GET") {
    json list = json::array();
    for (const auto& [id, job] : jobs_) {
      json j = job->ToJson();
      j.erase("blobs");
      list.push_back(j);
    }
    co_return JsonReply(200, {{"jobs", list}});
  }
  if (t.path.size() > kPrefix.size() + 1 && method == "GET") {
    const std::string id = t.path.substr(kPrefix.size() + 1);
    if (!Find(id)) co_return JsonReply(404, {{"error", "no prefetch job " + id}});
    auto wait = ParseCount(t.Param("wait_ms", "0"));
    auto since = ParseCount(t.Param("since", "0"));
    if (!wait || !since) {
      co_return JsonReply(400, {{"error", "wait_ms and since must be non-negative integers"}});
    }
    if (*wait > 0) {
      const auto timeout = std::min(std::chrono::milliseconds(*wait), kMaxWait);
      co_await WaitChange(id, static_cast<uint64_t>(*since), timeout);
    }
    auto job = Find(id);
    if (!job) co_return JsonReply(404, {{"error", "no prefetch job " + id}});
    co_return JsonReply(200, job->ToJson());
  }
  shim::AdminReply refused = JsonReply(
      405,
      {{"error", method + " " + t.path + " is not a prefetch endpoint (POST " +
                     std::string(kPrefix) + "?ref=IMAGE, GET " + std::string(kPrefix) + "[/ID])"}});
  refused.allow = t.path == kPrefix ? "GET, POST" : "GET";
  co_return refused;
}

}  // namespace shoal::agent
