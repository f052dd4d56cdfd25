#pragma once
// Layers prepared by shoal, not by containerd (issue 18 item 2). containerd's unpacker asks for
// each layer's extraction snapshot with Prepare("<ns>/<n>/extract-<unique> <chainID>", parent)
// and the label containerd.io/snapshot.ref=<chainID>; with the CRI plugin's snapshot
// annotations on, also the image reference, the manifest digest, the layer digest and the digests
// of the image's layers from this one up. LayerPrep then fetches the layer through the agent's
// own pull path (cache, swarm or upstream), extracts it with lib/extract (blob digest and diff
// ID verified), commits it as <chainID> with the Prepare's labels and reports it prepared: the
// service answers AlreadyExists, and containerd skips its fetch and unpack of that layer (as for
// stargz-snapshotter and nydus). On the first such Prepare of an image, the image's later layers
// are fetched and extracted at once in the background (bounded workers), each into a staging
// directory that the layer's own Prepare moves into its snapshot. Anything LayerPrep cannot do
// leaves the store as it was and the caller prepares an empty snapshot as usual, within
// options.timeout. No gRPC here.
//
// Stage does the same ahead of containerd, for a prefetch (issue 18 item 3): every layer of an
// image is extracted into staging and kept until its Prepare claims it (a rename) or the
// prefetch's keep time passes. Such layers are recorded next to their directory
// (staging/<dir>.json) and survive an agent restart on the same boot; after a reboot they are
// deleted, since extracted files are not fsynced (a crash of the machine may have cut them).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lib/core/digest.h"
#include "lib/core/error.h"
#include "lib/extract/byte_source.h"
#include "snapshotter/store.h"

namespace shoal::snapshotter {

// The labels containerd 1.6 sends (unpacker.go; pkg/snapshotters/annotations.go).
inline constexpr char kTargetLabel[] = "containerd.io/snapshot.ref";
inline constexpr char kImageRefLabel[] = "containerd.io/snapshot/cri.image-ref";
inline constexpr char kManifestLabel[] = "containerd.io/snapshot/cri.manifest-digest";
inline constexpr char kLayerLabel[] = "containerd.io/snapshot/cri.layer-digest";
inline constexpr char kImageLayersLabel[] = "containerd.io/snapshot/cri.image-layers";

using Deadline = std::chrono::steady_clock::time_point;

// What LayerPrep needs from the agent. Called from LayerPrep's and gRPC's threads; blocking;
// every call returns by `deadline` (then with kUnavailable).
class LayerSource {
 public:
  virtual ~LayerSource() = default;
  struct ManifestBody {
    std::string body;
    std::string media_type;
  };
  // The manifest `digest` in the repository of `image_ref` (the CRI's reference,
  // "registry/repository:tag"), verified. Errors: the pull path's; kRefused for a repository
  // the agent serves only to clients it checked.
  virtual Result<ManifestBody> Manifest(const std::string& image_ref, const Digest& digest,
                                        Deadline deadline) = 0;
  // Fetches blob `digest` of that repository into the agent's cache (verified) and returns the
  // path of the complete file. Errors: as Manifest.
  virtual Result<std::string> Blob(const std::string& image_ref, const Digest& digest,
                                   Deadline deadline) = 0;
  // Blob `digest` as a stream of its bytes as they arrive in the agent (the fetch goes on into
  // the cache as for any pull); each Read waits for its bytes, by `deadline`. The stream is not
  // verified here (ExtractOptions::expected_digest does that). Errors: as Manifest.
  virtual Result<std::unique_ptr<extract::ByteSource>> OpenBlob(const std::string& image_ref,
                                                                const Digest& digest,
                                                                Deadline deadline) = 0;
};

struct LayerPrepOptions {
  unsigned workers = 3;                        // layers fetched and extracted at once
  // Longest a Prepare waits for its layer; a layer's fetch gets twice this from its start.
  std::chrono::milliseconds timeout{300'000};
  std::chrono::minutes staged_ttl{10};  // unclaimed extracted layers are deleted after this
  // Called on a worker thread, without LayerPrep's lock, after a layer was extracted into
  // staging (the agent re-checks its cache budget, which counts StagedBytes).
  std::function<void()> on_staged;
  // This boot's id (/proc/sys/kernel/random/boot_id) when empty; a test passes another to play
  // a reboot.
  std::string boot_id;
};

// How a Stage of one image stands.
struct StageProgress {
  size_t layers = 0;    // the image's layers (known once its manifest and config were read)
  size_t prepared = 0;  // extracted and kept for their Prepare, or committed snapshots already
  size_t failed = 0;    // not extracted (containerd will unpack them itself)
  bool done = false;    // final: every layer prepared or failed, or the image could not be read
  std::string error;    // the first failure: the image's, or a layer's
};

// What TryPrepare did.
struct PrepareOutcome {
  bool prepared = false;  // committed snapshot labels[kTargetLabel] on `parent` exists now
  std::string reason;     // when not: why (for the log)
};

// Counters, for logs, metrics and tests.
struct LayerPrepStats {
  uint64_t prepared = 0;   // Prepares answered with a snapshot shoal extracted (or had)
  uint64_t fallbacks = 0;  // Prepares left to containerd
  uint64_t extracted = 0;  // layers extracted (claimed or not)
  uint64_t restored = 0;   // staged layers found again at start (kept for a prefetch)
};

class LayerPrep {
 public:
  // Stages under store.root()/staging (emptied now); starts the workers. `store` and `source`
  // outlive this object.
  LayerPrep(Store& store, LayerSource& source, LayerPrepOptions options = {});
  ~LayerPrep();  // Stop()s
  LayerPrep(const LayerPrep&) = delete;
  LayerPrep& operator=(const LayerPrep&) = delete;

  // Whether a Prepare with these labels is an unpacker's (it names a target snapshot).
  static bool Wants(const Labels& labels);
  // For containerd's Prepare of `key` on `parent`: makes the committed snapshot
  // labels[kTargetLabel] on `parent` (or finds it made) and returns prepared; otherwise the
  // store is as before and the reason is returned. Blocks at most options.timeout. Thread-safe.
  PrepareOutcome TryPrepare(const std::string& key, const std::string& parent,
                            const Labels& labels);
  // Extracts every layer of image manifest `manifest` (in image_ref's repository) ahead of
  // containerd and keeps each for its Prepare until `keep` passes (at least staged_ttl).
  // Returns at once; on_change is called from LayerPrep's threads after each change, without
  // its lock, the last time with done set. Thread-safe.
  void Stage(const std::string& image_ref, const Digest& manifest, std::chrono::seconds keep,
             std::function<void(const StageProgress&)> on_change);
  // Bytes on disk of the extracted layers waiting in staging for their Prepare. Lock-free.
  uint64_t StagedBytes() const { return staged_bytes_.load(std::memory_order_relaxed); }
  // Waiting Prepares fall back now; workers finish the layer at hand and exit; unclaimed
  // extracted layers are deleted. Idempotent.
  void Stop();
  LayerPrepStats stats() const;

 private:
  struct PlanLayer {
    Digest blob = Digest::FromSha256Hex(std::string(64, '0'));
    std::string media_type;
    Digest diff_id = Digest::FromSha256Hex(std::string(64, '0'));
    std::string chain_id;
  };
  struct Job {
    PlanLayer layer;
    std::string image_ref;
    enum class State { kQueued, kRunning, kDone, kFailed } state = State::kQueued;
    std::string dir;    // the extracted layer (kDone)
    bool root_entry = false;
    std::string error;  // kFailed
    Deadline finished{};
    Deadline keep_until{};   // a Stage keeps it this long (and records it on disk)
    bool persisted = false;  // its record (dir + ".json") is written
    bool abandoned = false;  // a Prepare gave up on it and nobody else wants it
    uint64_t bytes = 0;      // on disk, once extracted
  };
  // One Stage call.
  struct StageJob {
    std::string image_ref;
    Digest manifest = Digest::FromSha256Hex(std::string(64, '0'));
    std::chrono::seconds keep{0};
    std::function<void(const StageProgress&)> on_change;
    bool planned = false;
    std::vector<std::shared_ptr<Job>> jobs;
    size_t already = 0;               // committed snapshots already
    size_t unsupported = 0;           // layers of a media type shoal does not extract
    std::vector<std::string> errors;  // the plan's, and the layers' it does not extract
  };

  // The image's layers (from the cache of plans, else Resolve); a failure is remembered for
  // 30 s. Resolve: the manifest and config through the source.
  Result<std::vector<PlanLayer>> Plan(const std::string& image_ref, const Digest& manifest,
                                      Deadline deadline);
  Result<std::vector<PlanLayer>> Resolve(const std::string& image_ref, const Digest& manifest,
                                         Deadline deadline);
  // Queues a job for layer (front: wanted now) unless one exists. Requires mu_.
  std::shared_ptr<Job> Enqueue(const PlanLayer& layer, const std::string& image_ref, bool front);
  // Moves the extracted layer into a new snapshot and commits it. Errors name the step.
  Status Install(const Job& job, const std::string& target, const std::string& key,
                 const std::string& parent, const Labels& labels);
  void Worker();
  void Run(Job& job);
  // Plans a Stage and queues its layers.
  void RunStage(const std::shared_ptr<StageJob>& stage);
  // The stage's progress. Requires mu_.
  StageProgress ProgressLocked(const StageJob& stage) const;
  // Reports to the stages `which` selects (outside mu_) and drops those that are done.
  void ReportStages(const std::function<bool(const StageJob&)>& which);
  // Writes the job's record (a kept, extracted layer) so that a restart finds it. Without mu_.
  void Persist(const std::shared_ptr<Job>& job);
  // Deletes a staged job's directory and record and gives its bytes back.
  void Discard(const Job& job);
  // Restores the staged layers an earlier run kept (same boot, keep time not passed) and
  // deletes everything else under staging. Constructor only.
  void Restore();
  // Deletes extracted layers nobody claimed within staged_ttl. Requires mu_.
  void Expire(Deadline now);
  PrepareOutcome Fallback(std::string reason);

  Store& store_;
  LayerSource& source_;
  const LayerPrepOptions options_;
  const std::string staging_;
  const bool privileged_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // any job's state, the queue, stopping_
  bool stopping_ = false;                                 // GUARDED_BY(mu_)
  uint64_t next_dir_ = 0;                                 // GUARDED_BY(mu_)
  std::map<std::string, std::shared_ptr<Job>> jobs_;      // by blob digest; GUARDED_BY(mu_)
  std::deque<std::shared_ptr<Job>> queue_;                // GUARDED_BY(mu_)
  std::deque<std::shared_ptr<StageJob>> stage_queue_;     // not planned yet; GUARDED_BY(mu_)
  std::vector<std::shared_ptr<StageJob>> stages_;         // planned, not done; GUARDED_BY(mu_)
  std::atomic<uint64_t> staged_bytes_{0};
  std::string boot_id_;  // this boot's, for staged layers' records; empty: none are kept
  std::string dir_tag_;  // in every staging directory's name: unique to this run
  std::map<std::string, std::vector<PlanLayer>> plans_;   // by manifest digest; GUARDED_BY(mu_)
  struct PlanFailure {
    Error error;
    Deadline at;
  };
  // Recent failures by manifest digest, so the image's next layers fall back at once.
  std::map<std::string, PlanFailure> plan_failures_;      // GUARDED_BY(mu_)
  LayerPrepStats stats_;                                  // GUARDED_BY(mu_)
  std::vector<std::thread> workers_;
};

}  // namespace shoal::snapshotter
