#pragma once
// Node prefetch: jobs that warm this node's cache with whole images before they are needed.
// With `snapshots`, a job also extracts every layer for the agent's containerd snapshotter
// (snapshotter::LayerPrep::Stage), so that a pull of the image afterwards extracts nothing.
// A job resolves each image (the platform's manifest of an index), pins it (owner "prefetch")
// and fetches its config and layers through PullThrough::FetchToCache, several at once, so the
// swarm and the tracker's leases are used exactly as for a runtime pull. Jobs report progress
// per blob and are kept a while after they end. Served on the admin API under
// /shoal/v1/prefetch (see docs/architecture.md, "Prefetch"); cluster jobs from the tracker run
// through the same Start (agent/prefetch_poller.h).

#include <utility>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "agent/notifier.h"
#include "agent/pull_through.h"
#include "lib/store/blob_store.h"
#include "registry-shim/server.h"
#include "snapshotter/layer_prep.h"

namespace shoal::agent {

// What to prefetch.
struct PrefetchRequest {
  std::vector<std::string> images;       // image references, e.g. gcr.io/proj/img:tag
  std::string platform = "linux/amd64";  // chosen from an index
  // How long the pins last; 0 = until unpinned.
  std::chrono::seconds ttl = std::chrono::hours(24);
  int parallel = 4;  // blobs fetched at once
  // Also extract the layers for containerd (kept for its Prepares as long as the pins last;
  // 24 h when they do not expire).
  bool snapshots = false;
};

struct PrefetchOptions {
  size_t max_jobs = 32;                                     // kept, running or ended
  std::chrono::seconds keep_ended = std::chrono::hours(1);  // an ended job is kept this long
};

// One blob of a job.
struct PrefetchBlob {
  enum class State { kWaiting, kFetching, kDone, kFailed };
  Digest digest;
  std::string image;  // the first image of the job that lists it
  std::string kind;   // "config" or "layer"
  uint64_t size = 0;
  uint64_t done = 0;  // bytes verified so far
  State state = State::kWaiting;
  std::string error;
  shim::RepoRef repo;
};

// One job: its images (with their resolution), blobs and totals.
struct PrefetchJob {
  enum class State { kRunning, kDone, kFailed };
  struct Image {
    std::string ref;
    std::string digest;  // of the manifest the reference names, once resolved
    std::string error;   // why it could not be resolved or pinned
    bool resolved = false;
    std::optional<snapshotter::StageProgress> snapshots;  // with request.snapshots, once staged
  };
  std::string id;
  PrefetchRequest request;
  std::vector<Image> images;
  std::vector<PrefetchBlob> blobs;
  State state = State::kRunning;
  std::string error;  // a summary when failed
  std::chrono::system_clock::time_point started;
  std::optional<std::chrono::system_clock::time_point> ended;
  std::chrono::steady_clock::time_point ended_steady;
  uint64_t version = 0;  // bumped on every change
  int workers = 0;       // fetch coroutines still running
  int stages = 0;        // images whose layers are still being extracted (request.snapshots)
  std::function<void(const PrefetchJob&)> on_change;

  // The job as JSON: id, state, images, blobs, totals (bytes_total, bytes_done, blobs_*), and
  // with request.snapshots the layers extracted ("snapshots": layers, prepared, failed).
  nlohmann::json ToJson() const;
};

// Network-thread only. Lives as long as the io_context runs.
class Prefetcher {
 public:
  // pull_through and store must outlive this object.
  Prefetcher(boost::asio::io_context& ioc, PullThrough& pull_through, store::BlobStore& store,
             PrefetchOptions options = {});

  // Lets jobs extract layers for the snapshotter (request.snapshots); `prep` outlives this
  // object, or is Stopped first. Without it such requests are refused.
  void EnableSnapshots(snapshotter::LayerPrep* prep) { layer_prep_ = prep; }
  // Starts a job with `id` (a fresh one when empty) and returns its id; on_change is called
  // after every change of the job. Errors: kInvalidArgument for an empty request, a bad
  // platform or parallelism, an id already in use, or snapshots without EnableSnapshots;
  // kUnavailable when max_jobs jobs run.
  Result<std::string> Start(PrefetchRequest request, std::string id = "",
                            std::function<void(const PrefetchJob&)> on_change = {});
  // The job, or null when unknown (or dropped after keep_ended).
  std::shared_ptr<const PrefetchJob> Find(const std::string& id) const;
  // Suspends until the job's version passes `since` or `timeout` passes.
  boost::asio::awaitable<void> WaitChange(const std::string& id, uint64_t since,
                                          std::chrono::milliseconds timeout);
  // The admin API under /shoal/v1/prefetch:
  //   POST /shoal/v1/prefetch?ref=IMAGE[&ref=...]&platform=os/arch&ttl=S&parallel=N
  //        [&snapshots=1] -> job
  //   GET  /shoal/v1/prefetch                       -> {"jobs": [summaries]}
  //   GET  /shoal/v1/prefetch/{id}?wait_ms=N&since=V -> job (long-polls until version > V)
  boost::asio::awaitable<shim::AdminReply> HandleAdmin(const std::string& method,
                                                       const std::string& target);
  // Whether target is for HandleAdmin.
  static bool Owns(const std::string& target);

 private:
  boost::asio::awaitable<void> Run(std::shared_ptr<PrefetchJob> job);
  boost::asio::awaitable<void> Worker(std::shared_ptr<PrefetchJob> job);
  void Changed(PrefetchJob& job);
  // Finishes the job once no fetch and no layer extraction runs.
  void MaybeFinish(PrefetchJob& job);
  void Finish(PrefetchJob& job);
  // A Stage's progress for image `index` of the job (network thread).
  void OnStage(PrefetchJob& job, size_t index, const snapshotter::StageProgress& progress);
  // Drops ended jobs past keep_ended, and the oldest ended ones beyond max_jobs - 1.
  bool MakeRoom();

  boost::asio::io_context& ioc_;
  PullThrough& pull_through_;
  store::BlobStore& store_;
  PrefetchOptions options_;
  std::map<std::string, std::shared_ptr<PrefetchJob>> jobs_;
  Notifier changes_;
  snapshotter::LayerPrep* layer_prep_ = nullptr;
  std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace shoal::agent
