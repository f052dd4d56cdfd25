#include "snapshotter/layer_prep.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "lib/core/atomic_file.h"
#include "lib/core/sha256.h"
#include "lib/extract/byte_source.h"
#include "lib/extract/layer.h"
#include "lib/oci/manifest.h"

namespace shoal::snapshotter {
namespace fs = std::filesystem;

namespace {

// An image config is small; a larger one is not an image config.
constexpr uint64_t kMaxConfigBytes = 16u << 20;
// Plans kept (one per image manifest); the map is cleared when it reaches this.
constexpr size_t kMaxPlans = 64;
// How long an image whose manifest or config could not be had falls back at once: its other
// layers' Prepares do not each wait for the same failure.
constexpr auto kPlanFailureTtl = std::chrono::seconds(30);

// The layer media types lib/extract handles (it detects gzip and zstd from the bytes) and
// containerd's applier does too. Foreign and non-distributable layers, encrypted ones and
// anything else are left to containerd.
bool Supported(const std::string& media_type) {
  static const std::set<std::string> kTypes = {
      "application/vnd.oci.image.layer.v1.tar",
      "application/vnd.oci.image.layer.v1.tar+gzip",
      "application/vnd.oci.image.layer.v1.tar+zstd",
      "application/vnd.docker.image.rootfs.diff.tar",
      "application/vnd.docker.image.rootfs.diff.tar.gzip",
  };
  return kTypes.count(media_type) > 0;
}

std::string LabelOr(const Labels& labels, const char* key) {
  auto it = labels.find(key);
  return it == labels.end() ? std::string() : it->second;
}

Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError(ErrorCode::kIo, "open " + path + ": " + std::strerror(errno));
  std::string out;
  char buf[65536];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    out.append(buf, static_cast<size_t>(in.gcount()));
    if (out.size() > max_bytes) {
      return MakeError(ErrorCode::kInvalidArgument,
                       path + " is over " + std::to_string(max_bytes) + " bytes");
    }
  }
  if (in.bad()) return MakeError(ErrorCode::kIo, "read " + path);
  return out;
}

// rootfs.diff_ids of an image config. Errors: kInvalidArgument naming what is wrong.
Result<std::vector<Digest>> DiffIds(const std::string& config) {
  auto j = nlohmann::json::parse(config, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return MakeError(ErrorCode::kInvalidArgument, "image config is not a JSON object");
  }
  auto rootfs = j.find("rootfs");
  if (rootfs == j.end() || !rootfs->is_object()) {
    return MakeError(ErrorCode::kInvalidArgument, "image config has no rootfs object");
  }
  auto ids = rootfs->find("diff_ids");
  if (ids == rootfs->end() || !ids->is_array()) {
    return MakeError(ErrorCode::kInvalidArgument, "image config has no rootfs.diff_ids array");
  }
  std::vector<Digest> out;
  for (const auto& v : *ids) {
    if (!v.is_string()) {
      return MakeError(ErrorCode::kInvalidArgument, "image config: a diff ID is not a string");
    }
    auto d = Digest::Parse(v.get<std::string>());
    if (!d) return MakeError(ErrorCode::kInvalidArgument, "image config diff ID: " + d.error().message);
    out.push_back(d.value());
  }
  return out;
}

void RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) spdlog::warn("snapshotter: remove {}: {}", path, ec.message());
}

// This boot's id: staged layers are kept across agent restarts, not across reboots.
std::string BootId() {
  auto text = ReadSmallFile("/proc/sys/kernel/random/boot_id", 256);
  if (!text) return "";
  std::string id = text.value();
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

int64_t UnixMsNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr char kRecordSuffix[] = ".json";

}  // namespace

LayerPrep::LayerPrep(Store& store, LayerSource& source, LayerPrepOptions options)
    : store_(store),
      source_(source),
      options_(options),
      staging_(store.root() + "/staging"),
      privileged_(extract::RunningPrivileged()),
      boot_id_(options.boot_id.empty() ? BootId() : options.boot_id),
      dir_tag_(std::to_string(UnixMsNow())) {
  Restore();
  if (!privileged_) {
    spdlog::warn("snapshotter: not running as root: containerd unpacks every layer itself "
                 "(overlay whiteouts need CAP_MKNOD)");
  }
  for (unsigned i = 0; i < std::max(1u, options_.workers); ++i) {
    workers_.emplace_back([this] { Worker(); });
  }
}

LayerPrep::~LayerPrep() { Stop(); }

void LayerPrep::Restore() {
  std::error_code ec;
  fs::create_directories(staging_, ec);
  if (ec) {
    spdlog::warn("snapshotter: create {}: {}", staging_, ec.message());
    return;
  }
  const int64_t now_ms = UnixMsNow();
  const Deadline steady_now = std::chrono::steady_clock::now();
  std::set<std::string> kept;
  for (fs::directory_iterator it(staging_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string record = it->path().string();
    if (!record.ends_with(kRecordSuffix) || boot_id_.empty()) continue;
    const std::string dir = record.substr(0, record.size() - std::strlen(kRecordSuffix));
    auto text = ReadSmallFile(record, 64u << 10);
    if (!text) continue;
    auto j = nlohmann::json::parse(text.value(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || j.value("boot_id", "") != boot_id_) continue;
    try {
      const int64_t keep_until_ms = j.at("keep_until_ms").get<int64_t>();
      auto blob = Digest::Parse(j.at("blob").get<std::string>());
      auto diff_id = Digest::Parse(j.at("diff_id").get<std::string>());
      if (keep_until_ms <= now_ms || !blob || !diff_id) continue;
      if (jobs_.count(blob.value().str()) || !fs::is_directory(dir, ec)) continue;
      auto job = std::make_shared<Job>();
      job->layer = PlanLayer{blob.value(), j.at("media_type").get<std::string>(), diff_id.value(),
                             j.at("chain_id").get<std::string>()};
      job->image_ref = j.at("image_ref").get<std::string>();
      job->root_entry = j.at("root_entry").get<bool>();
      job->bytes = j.at("bytes").get<uint64_t>();
      job->dir = dir;
      job->state = Job::State::kDone;
      job->finished = steady_now;
      job->keep_until = steady_now + std::chrono::milliseconds(keep_until_ms - now_ms);
      job->persisted = true;
      jobs_[blob.value().str()] = job;
      kept.insert(dir);
      kept.insert(record);
      staged_bytes_ += job->bytes;
      ++stats_.restored;
    } catch (const nlohmann::json::exception& e) {
      spdlog::warn("snapshotter: staged layer record {} is malformed: {}", record, e.what());
    }
  }
  // Whatever else an earlier run staged was never claimed by a snapshot and is not kept.
  std::vector<std::string> stale;
  for (fs::directory_iterator it(staging_, ec), end; !ec && it != end; it.increment(ec)) {
    if (!kept.count(it->path().string())) stale.push_back(it->path().string());
  }
  for (const auto& path : stale) RemoveTree(path);
  if (stats_.restored > 0) {
    spdlog::info("snapshotter: {} staged layers ({} bytes) kept from an earlier run",
                 stats_.restored, staged_bytes_.load());
  }
}

void LayerPrep::Persist(const std::shared_ptr<Job>& job) {
  if (boot_id_.empty()) return;
  std::string body, record;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job->persisted || job->state != Job::State::kDone || job->dir.empty()) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        job->keep_until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    nlohmann::json j = {{"boot_id", boot_id_},
                        {"keep_until_ms", UnixMsNow() + left.count()},
                        {"blob", job->layer.blob.str()},
                        {"media_type", job->layer.media_type},
                        {"diff_id", job->layer.diff_id.str()},
                        {"chain_id", job->layer.chain_id},
                        {"image_ref", job->image_ref},
                        {"root_entry", job->root_entry},
                        {"bytes", job->bytes}};
    body = j.dump();
    record = job->dir + kRecordSuffix;
  }
  // The write (an fsync) runs without the lock; a Prepare may claim the layer meanwhile.
  if (auto st = WriteFileAtomic(record + ".tmp", record, body); !st) {
    spdlog::warn("snapshotter: staged layer {} stays only until a restart: {}",
                 job->layer.blob.str(), st.error().ToString());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job->layer.blob.str());
  if (it == jobs_.end() || it->second != job) {
    ::unlink(record.c_str());  // claimed or dropped while the record was written
  } else {
    job->persisted = true;
  }
}

void LayerPrep::Discard(const Job& job) {
  if (job.dir.empty()) return;
  ::unlink((job.dir + kRecordSuffix).c_str());
  RemoveTree(job.dir);
  staged_bytes_ -= std::min(staged_bytes_.load(), job.bytes);
}

void LayerPrep::Stage(const std::string& image_ref, const Digest& manifest,
                      std::chrono::seconds keep,
                      std::function<void(const StageProgress&)> on_change) {
  auto stage = std::make_shared<StageJob>();
  stage->image_ref = image_ref;
  stage->manifest = manifest;
  stage->keep = keep;
  stage->on_change = std::move(on_change);
  std::string refused;
  if (!privileged_) refused = "the agent is not root (overlay whiteouts need CAP_MKNOD)";
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (refused.empty() && stopping_) refused = "the agent is stopping";
    if (refused.empty()) stage_queue_.push_back(stage);
  }
  if (!refused.empty()) {
    StageProgress p;
    p.done = true;
    p.error = refused;
    if (stage->on_change) stage->on_change(p);
    return;
  }
  cv_.notify_all();
}

void LayerPrep::RunStage(const std::shared_ptr<StageJob>& stage) {
  const Deadline now = std::chrono::steady_clock::now();
  auto plan = Plan(stage->image_ref, stage->manifest, now + options_.timeout);
  std::vector<std::shared_ptr<Job>> to_persist;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stage->planned = true;
    if (!plan) {
      stage->errors.push_back("image " + stage->image_ref + ": " + plan.error().ToString());
    } else {
      const Deadline keep_until =
          now + std::max<std::chrono::steady_clock::duration>(stage->keep, options_.staged_ttl);
      for (const PlanLayer& l : plan.value()) {
        if (!Supported(l.media_type)) {
          stage->errors.push_back("layer " + l.blob.str() + " has media type " + l.media_type +
                                  ", which shoal does not extract");
          ++stage->unsupported;
          continue;
        }
        if (auto info = store_.Stat(l.chain_id); info && info.value().kind == Kind::kCommitted) {
          ++stage->already;
          continue;
        }
        // A failure is retried: a prefetch is the operator asking again.
        if (auto it = jobs_.find(l.blob.str());
            it != jobs_.end() && it->second->state == Job::State::kFailed) {
          jobs_.erase(it);
        }
        auto job = Enqueue(l, stage->image_ref, /*front=*/false);
        job->keep_until = std::max(job->keep_until, keep_until);
        if (job->state == Job::State::kDone) to_persist.push_back(job);
        stage->jobs.push_back(job);
      }
    }
    stages_.push_back(stage);
  }
  cv_.notify_all();
  for (const auto& job : to_persist) Persist(job);
  ReportStages([&](const StageJob& s) { return &s == stage.get(); });
}

StageProgress LayerPrep::ProgressLocked(const StageJob& stage) const {
  StageProgress p;
  p.layers = stage.jobs.size() + stage.already + stage.unsupported;
  p.prepared = stage.already;
  p.failed = stage.unsupported;
  std::string first_layer_error;
  for (const auto& job : stage.jobs) {
    if (job->state == Job::State::kDone && !job->abandoned) {
      ++p.prepared;
    } else if (job->state == Job::State::kFailed || job->abandoned) {
      ++p.failed;
      if (first_layer_error.empty()) {
        first_layer_error = job->abandoned ? "layer " + job->layer.blob.str() +
                                                 " was given up by a Prepare that timed out"
                                           : job->error;
      }
    }
  }
  p.error = stage.errors.empty() ? first_layer_error : stage.errors.front();
  p.done = stage.planned && p.prepared + p.failed == p.layers;
  return p;
}

void LayerPrep::ReportStages(const std::function<bool(const StageJob&)>& which) {
  std::vector<std::pair<std::shared_ptr<StageJob>, StageProgress>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = stages_.begin(); it != stages_.end();) {
      if (!which(**it)) {
        ++it;
        continue;
      }
      StageProgress p = ProgressLocked(**it);
      if (stopping_ && !p.done) {
        p.done = true;
        if (p.error.empty()) p.error = "the agent is stopping";
      }
      calls.emplace_back(*it, p);
      it = p.done ? stages_.erase(it) : it + 1;
    }
  }
  for (const auto& [stage, p] : calls) {
    if (stage->on_change) stage->on_change(p);
  }
}

void LayerPrep::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
  // Stages still waiting end now, with the reason.
  ReportStages([](const StageJob&) { return true; });
  std::vector<std::shared_ptr<StageJob>> unplanned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    unplanned.assign(stage_queue_.begin(), stage_queue_.end());
    stage_queue_.clear();
  }
  for (const auto& stage : unplanned) {
    StageProgress p;
    p.done = true;
    p.error = "the agent is stopping";
    if (stage->on_change) stage->on_change(p);
  }
  // Layers extracted for Prepares that will not come now, except those a Stage keeps (on disk,
  // for the next run).
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [blob, job] : jobs_) {
    if (job->state == Job::State::kDone && !job->persisted) Discard(*job);
  }
  jobs_.clear();
  queue_.clear();
}

LayerPrepStats LayerPrep::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool LayerPrep::Wants(const Labels& labels) { return labels.count(kTargetLabel) > 0; }

PrepareOutcome LayerPrep::Fallback(std::string reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.fallbacks;
  }
  return PrepareOutcome{false, std::move(reason)};
}

Result<std::vector<LayerPrep::PlanLayer>> LayerPrep::Plan(const std::string& image_ref,
                                                          const Digest& manifest,
                                                          Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(manifest.str());
    if (it != plans_.end()) return it->second;
    auto failed = plan_failures_.find(manifest.str());
    if (failed != plan_failures_.end()) {
      if (std::chrono::steady_clock::now() - failed->second.at < kPlanFailureTtl) {
        return failed->second.error;
      }
      plan_failures_.erase(failed);
    }
  }
  auto plan = Resolve(image_ref, manifest, deadline);
  std::lock_guard<std::mutex> lock(mu_);
  if (!plan) {
    if (plan_failures_.size() >= kMaxPlans) plan_failures_.clear();
    plan_failures_[manifest.str()] = PlanFailure{plan.error(), std::chrono::steady_clock::now()};
    return plan.error();
  }
  if (plans_.size() >= kMaxPlans) plans_.clear();
  plans_[manifest.str()] = plan.value();
  return plan;
}

Result<std::vector<LayerPrep::PlanLayer>> LayerPrep::Resolve(const std::string& image_ref,
                                                             const Digest& manifest,
                                                             Deadline deadline) {
  auto body = source_.Manifest(image_ref, manifest, deadline);
  if (!body) return body.error();
  if (manifest.algorithm() == DigestAlgorithm::kSha256 &&
      Sha256::Of(body.value().body) != manifest) {
    return MakeError(ErrorCode::kDigestMismatch, "manifest " + manifest.str() + " of " +
                                                     image_ref + " does not hash to its digest");
  }
  auto parsed = oci::ParseManifest(body.value().body, body.value().media_type);
  if (!parsed) return parsed.error();
  if (parsed.value().is_index || !parsed.value().config) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "manifest " + manifest.str() + " of " + image_ref + " is not an image manifest");
  }
  const oci::Descriptor& config = *parsed.value().config;
  auto path = source_.Blob(image_ref, config.digest, deadline);
  if (!path) return path.error();
  auto text = ReadSmallFile(path.value(), kMaxConfigBytes);
  if (!text) return text.error();
  auto diff_ids = DiffIds(text.value());
  if (!diff_ids) {
    return MakeError(diff_ids.error().code,
                     "config " + config.digest.str() + ": " + diff_ids.error().message);
  }
  const auto& layers = parsed.value().layers;
  if (diff_ids.value().size() != layers.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "manifest " + manifest.str() + " has " + std::to_string(layers.size()) +
                         " layers and its config " + std::to_string(diff_ids.value().size()) +
                         " diff IDs");
  }
  std::vector<PlanLayer> plan;
  std::string chain;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Digest& diff = diff_ids.value()[i];
    chain = i == 0 ? diff.str() : Sha256::Of(chain + " " + diff.str()).str();
    plan.push_back(PlanLayer{layers[i].digest, layers[i].media_type, diff, chain});
  }
  return plan;
}

std::shared_ptr<LayerPrep::Job> LayerPrep::Enqueue(const PlanLayer& layer,
                                                   const std::string& image_ref, bool front) {
  auto it = jobs_.find(layer.blob.str());
  if (it != jobs_.end()) {
    std::shared_ptr<Job> job = it->second;
    if (front && job->state == Job::State::kQueued) {
      // Wanted now: ahead of the background layers.
      auto q = std::find(queue_.begin(), queue_.end(), job);
      if (q != queue_.end()) {
        queue_.erase(q);
        queue_.push_front(job);
      }
    }
    return job;
  }
  auto job = std::make_shared<Job>();
  job->layer = layer;
  job->image_ref = image_ref;
  jobs_[layer.blob.str()] = job;
  if (front) {
    queue_.push_front(job);
  } else {
    queue_.push_back(job);
  }
  return job;
}

void LayerPrep::Expire(Deadline now) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const Job& job = *it->second;
    // A Stage keeps an extracted layer longer; a failure is forgotten as soon as ever.
    bool over = (job.state == Job::State::kFailed && now - job.finished > options_.staged_ttl) ||
                (job.state == Job::State::kDone && now - job.finished > options_.staged_ttl &&
                 now >= job.keep_until);
    if (over) {
      Discard(job);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
}

void LayerPrep::Worker() {
  for (;;) {
    std::shared_ptr<Job> job;
    std::shared_ptr<StageJob> stage;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Once a minute without work, unclaimed layers past their time go.
      if (!cv_.wait_for(lock, std::chrono::minutes(1),
                        [&] { return stopping_ || !queue_.empty() || !stage_queue_.empty(); })) {
        Expire(std::chrono::steady_clock::now());
        continue;
      }
      if (stopping_) return;
      if (!stage_queue_.empty()) {
        stage = stage_queue_.front();
        stage_queue_.pop_front();
      } else {
        job = queue_.front();
        queue_.pop_front();
        job->state = Job::State::kRunning;
      }
    }
    if (stage) {
      RunStage(stage);
      continue;
    }
    Run(*job);
    bool abandoned = false, kept = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job->state = job->dir.empty() ? Job::State::kFailed : Job::State::kDone;
      job->finished = std::chrono::steady_clock::now();
      auto it = jobs_.find(job->layer.blob.str());
      abandoned = it == jobs_.end() || it->second != job;
      job->abandoned = abandoned;
      if (job->state == Job::State::kDone) ++stats_.extracted;
      kept = !abandoned && job->state == Job::State::kDone && job->keep_until > job->finished;
    }
    // A Prepare that gave up on this layer (timeout) took it out of the map: nobody claims it.
    if (abandoned) Discard(*job);
    if (kept) Persist(job);
    if (!abandoned && job->state == Job::State::kDone && options_.on_staged) options_.on_staged();
    cv_.notify_all();
    const Job* done = job.get();
    ReportStages([done](const StageJob& s) {
      return std::any_of(s.jobs.begin(), s.jobs.end(),
                         [done](const std::shared_ptr<Job>& j) { return j.get() == done; });
    });
  }
}

// Runs without mu_ except where it takes it; the job's fields are its own until it is done.
void LayerPrep::Run(Job& job) {
  const PlanLayer& layer = job.layer;
  // The state changes in Worker, under the lock that also tells whether the job was abandoned.
  auto fail = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    job.error = what;
  };
  const auto started = std::chrono::steady_clock::now();
  if (layer.diff_id.algorithm() != DigestAlgorithm::kSha256) {
    return fail("layer " + layer.blob.str() + ": diff ID " + layer.diff_id.str() +
                " is not sha256, which shoal does not check");
  }
  // Twice the Prepare's bound: a layer started early in the background is not cut off before
  // its own Prepare (which comes later) gives up on it.
  // Extracted while it streams in.
  auto src = source_.OpenBlob(job.image_ref, layer.blob, started + 2 * options_.timeout);
  if (!src) return fail("fetch layer " + layer.blob.str() + ": " + src.error().ToString());
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir = staging_ + "/" + layer.blob.hex().substr(0, 16) + "-" + dir_tag_ + "-" +
          std::to_string(next_dir_++);
  }
  extract::ExtractOptions opts;
  opts.expected_digest = layer.blob;
  opts.expected_diff_id = layer.diff_id;
  opts.whiteouts = extract::WhiteoutMode::kOverlay;  // containerd's overlay format
  auto stats = extract::ExtractLayer(*src.value(), dir, opts);
  src.value().reset();  // the agent's reader goes back to the network thread now
  if (!stats) {
    RemoveTree(dir);
    return fail("extract layer " + layer.blob.str() + ": " + stats.error().ToString());
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - started)
                .count();
  spdlog::info("snapshotter: extracted layer {} ({} entries, {} bytes) in {} ms",
               layer.blob.str(), stats.value().entries, stats.value().raw_bytes, ms);
  auto usage = DiskUsage(dir);
  const uint64_t bytes =
      usage ? static_cast<uint64_t>(std::max<int64_t>(0, usage.value().size)) : 0;
  std::lock_guard<std::mutex> lock(mu_);
  job.dir = dir;
  job.root_entry = stats.value().root_entry;
  job.bytes = bytes;
  staged_bytes_ += bytes;
}

Status LayerPrep::Install(const Job& job, const std::string& target, const std::string& key,
                          const std::string& parent, const Labels& labels) {
  auto mounts = store_.Prepare(key, parent, labels);
  if (!mounts) return MakeError(ErrorCode::kIo, "prepare " + key + ": " + mounts.error().ToString());
  auto undo = [&](const std::string& what) -> Status {
    if (auto rm = store_.Remove(key); !rm) {
      spdlog::warn("snapshotter: remove {} after a failed install: {}", key, rm.error().ToString());
    }
    return MakeError(ErrorCode::kIo, what);
  };
  auto fsdir = store_.ActiveFsDir(key);
  if (!fsdir) return undo("snapshot " + key + ": " + fsdir.error().ToString());
  // The store made the empty upper dir as containerd's snapshotter does (0755, the parent's
  // owner); a layer without a root entry keeps that, as when containerd unpacks into it.
  struct stat st;
  if (::stat(fsdir.value().c_str(), &st) != 0) {
    return undo("stat " + fsdir.value() + ": " + std::strerror(errno));
  }
  if (!job.root_entry) {
    if (::chmod(job.dir.c_str(), st.st_mode & 07777) != 0 ||
        ::lchown(job.dir.c_str(), st.st_uid, st.st_gid) != 0) {
      return undo("set the root of " + job.dir + ": " + std::strerror(errno));
    }
  }
  if (::rmdir(fsdir.value().c_str()) != 0) {
    return undo("rmdir " + fsdir.value() + ": " + std::strerror(errno));
  }
  if (::rename(job.dir.c_str(), fsdir.value().c_str()) != 0) {
    int err = errno;
    ::mkdir(fsdir.value().c_str(), 0755);
    return undo("rename " + job.dir + " to " + fsdir.value() + ": " + std::strerror(err));
  }
  // The layer is the snapshot's now (the store counts it once committed).
  ::unlink((job.dir + kRecordSuffix).c_str());
  staged_bytes_ -= std::min(staged_bytes_.load(), job.bytes);
  if (auto c = store_.Commit(target, key, labels); !c) {
    return undo("commit " + key + " as " + target + ": " + c.error().ToString());
  }
  return Ok();
}

PrepareOutcome LayerPrep::TryPrepare(const std::string& key, const std::string& parent,
                                     const Labels& labels) {
  if (!privileged_) return Fallback("the agent is not root (overlay whiteouts need CAP_MKNOD)");
  const std::string target = LabelOr(labels, kTargetLabel);
  const std::string ref = LabelOr(labels, kImageRefLabel);
  const std::string manifest_text = LabelOr(labels, kManifestLabel);
  const std::string layer_text = LabelOr(labels, kLayerLabel);
  for (auto [name, value] : {std::pair{kTargetLabel, &target}, std::pair{kImageRefLabel, &ref},
                             std::pair{kManifestLabel, &manifest_text},
                             std::pair{kLayerLabel, &layer_text}}) {
    if (value->empty()) {
      return Fallback(std::string("no label ") + name +
                      " (the CRI plugin's snapshot annotations are off, or not a CRI pull)");
    }
  }
  auto manifest = Digest::Parse(manifest_text);
  if (!manifest) return Fallback(std::string("label ") + kManifestLabel + ": " + manifest.error().message);
  auto layer = Digest::Parse(layer_text);
  if (!layer) return Fallback(std::string("label ") + kLayerLabel + ": " + layer.error().message);

  // Made before (by an earlier pull, or in another namespace): containerd finds it by its
  // target label and parent.
  if (auto info = store_.Stat(target)) {
    const Info& i = info.value();
    auto t = i.labels.find(kTargetLabel);
    if (i.kind == Kind::kCommitted && i.parent == parent && t != i.labels.end() &&
        t->second == target) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.prepared;
      return PrepareOutcome{true, ""};
    }
    return Fallback("snapshot " + target + " exists as " + KindName(i.kind) + " on \"" +
                    i.parent + "\"");
  }

  const Deadline deadline = std::chrono::steady_clock::now() + options_.timeout;
  auto plan = Plan(ref, manifest.value(), deadline);
  if (!plan) return Fallback("image " + ref + ": " + plan.error().ToString());
  size_t index = plan.value().size();
  for (size_t i = 0; i < plan.value().size(); ++i) {
    if (plan.value()[i].blob == layer.value() && plan.value()[i].chain_id == target) index = i;
  }
  if (index == plan.value().size()) {
    return Fallback("layer " + layer.value().str() + " with chain ID " + target +
                    " is not in manifest " + manifest.value().str());
  }
  const PlanLayer& wanted = plan.value()[index];
  if (!Supported(wanted.media_type)) {
    return Fallback("layer " + wanted.blob.str() + " has media type " + wanted.media_type +
                    ", which shoal does not extract");
  }

  std::shared_ptr<Job> job;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) {
      ++stats_.fallbacks;
      return PrepareOutcome{false, "the agent is stopping"};
    }
    Expire(std::chrono::steady_clock::now());
    job = Enqueue(wanted, ref, /*front=*/true);
    // The image's later layers, as the CRI lists them, start now too (each in its own dir).
    std::set<std::string> listed;
    std::istringstream in(LabelOr(labels, kImageLayersLabel));
    for (std::string d; std::getline(in, d, ',');) listed.insert(d);
    for (size_t i = index + 1; i < plan.value().size(); ++i) {
      const PlanLayer& l = plan.value()[i];
      if (!listed.count(l.blob.str()) || !Supported(l.media_type)) continue;
      if (store_.Stat(l.chain_id)) continue;  // there already: its Prepare will not come
      Enqueue(l, ref, false);
    }
    lock.unlock();
    cv_.notify_all();
    lock.lock();
    bool ended = cv_.wait_until(lock, deadline, [&] {
      return stopping_ || job->state == Job::State::kDone || job->state == Job::State::kFailed;
    });
    auto it = jobs_.find(wanted.blob.str());
    const bool ours = it != jobs_.end() && it->second == job;
    if (!ended || stopping_) {
      // Abandoned: the worker deletes what it extracts; a queued job is dropped. A layer a Stage
      // keeps goes on for the next Prepare.
      if (ours && job->keep_until <= std::chrono::steady_clock::now()) {
        jobs_.erase(it);
        auto q = std::find(queue_.begin(), queue_.end(), job);
        if (q != queue_.end()) queue_.erase(q);
      }
      ++stats_.fallbacks;
      return PrepareOutcome{false, stopping_ ? "the agent is stopping"
                                             : "layer " + wanted.blob.str() +
                                                   " not extracted within " +
                                                   std::to_string(options_.timeout.count()) +
                                                   " ms"};
    }
    if (!ours) {
      // Another Prepare of the same layer (another namespace) claimed the directory first.
      ++stats_.fallbacks;
      return PrepareOutcome{false, "layer " + wanted.blob.str() + " claimed by another Prepare"};
    }
    jobs_.erase(it);  // claimed: the job's directory is this Prepare's now
  }
  if (job->state == Job::State::kFailed) return Fallback(job->error);
  // The Prepare's own target: a layer shared by two images sits on different chains.
  if (auto st = Install(*job, target, key, parent, labels); !st) {
    Discard(*job);
    return Fallback(st.error().message);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.prepared;
  return PrepareOutcome{true, ""};
}

}  // namespace shoal::snapshotter
