#pragma once
// The agent's client for the tracker's blob API (tracker/blobs/blob_api.h): chunk tables, upstream
// leases, publishing chunk metainfo. With several tracker replicas, each blob has an owner
// replica by rendezvous hashing of its digest over the replica URLs; when the owner does not
// answer, the next replica in that blob's order is asked. No database is involved: a replica
// that restarts (new tracker_id) is re-taught by the agents (see OnRestart).

#include <utility>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "lib/auth/tokens.h"
#include "lib/core/digest.h"
#include "lib/core/error.h"
#include "lib/http/client.h"
#include "lib/http/url.h"
#include "lib/swarm/chunk_torrent.h"

namespace shoal::agent {

// Where a blob comes from upstream, so whichever agent holds a lease can fetch it.
struct BlobSource {
  uint64_t size = 0;
  std::string registry;
  std::string repository;
};

// A blob's chunk table as the tracker has it.
struct ChunkTable {
  swarm::ChunkLayout layout;
  std::vector<std::string> metainfo;  // per chunk: the bencoded torrent, empty unless ready
};

// The tracker's answer to a lease request for one chunk, or to a work request for a blob.
struct LeaseAnswer {
  // kDone (work only): every chunk of the blob is ready.
  enum class Kind { kReady, kGranted, kWait, kDone };
  Kind kind = Kind::kWait;
  swarm::ChunkLayout layout;
  uint32_t chunk = 0;                        // kGranted: the chunk to fetch
  std::string metainfo;                      // kReady: the chunk's bencoded torrent
  std::string lease_id;                      // kGranted
  std::chrono::milliseconds ttl{0};          // kGranted: renew well before this passes
  std::chrono::milliseconds retry_after{0};  // kWait
  std::string reason;  // kWait: "leased", "cluster_cap", "agent_cap", "blob_cap", "unleased",
                       // "head_start"
};

// The tracker's answer to a ready poll: the chunks asked for that are ready (none: wait).
struct ReadyAnswer {
  swarm::ChunkLayout layout;
  std::vector<std::pair<uint32_t, std::string>> ready;  // chunk index, bencoded torrent
  std::chrono::milliseconds retry_after{0};             // when ready is empty
};

// ---- The cluster-wide manifest cache (tracker/manifests/manifest_api.h) ----

// What a manifest reference names: a tag or a digest ("sha256:...") in one repository.
struct ManifestRef {
  std::string registry;
  std::string repository;
  std::string reference;
};

// The tracker's answer to a manifest resolution. kFound's bytes are NOT verified here: the
// caller checks sha256(body) == digest (and == the reference, for a digest) before use.
struct TrackerManifest {
  // kFetch: this agent holds the lease: fetch upstream, then PublishManifest or ReleaseManifest.
  // kWait: another agent is fetching; ask again (long-polls).
  // kMissing: another agent's upstream fetch found nothing, `age` ago; answer "not found".
  enum class Kind { kFound, kFetch, kWait, kMissing };
  Kind kind = Kind::kWait;
  std::string digest;  // kFound, as the tracker sent it (parse and verify before use)
  std::string media_type;
  std::string body;
  std::chrono::milliseconds age{0};          // kFound for a tag, kMissing: since it was fetched
  std::string missing;                       // kMissing: the upstream's answer (its 404 text)
  std::chrono::milliseconds retry_after{0};  // kWait
  std::string lease_id;                      // kFetch: quote it when publishing or releasing
};

// ---- Cluster prefetch jobs (tracker/prefetch/prefetch_api.h) ----

// A job the tracker hands to this node.
struct TrackerPrefetchJob {
  std::string id;
  std::vector<std::string> images;
  std::string platform;
  int64_t ttl_s = 0;
  int parallel = 4;
  bool snapshots = false;  // also extract the layers for containerd (PrefetchRequest::snapshots)
};

// This node's progress on a job, as reported to the tracker.
struct TrackerPrefetchProgress {
  std::string state;  // running, done or failed
  std::string error;
  uint64_t bytes_done = 0, bytes_total = 0, blobs_done = 0, blobs_total = 0;
};

struct TrackerClientOptions {
  std::vector<http::Url> trackers;  // replica base URLs, e.g. http://10.0.0.5:7070
  std::string agent_id;             // this agent's identity in leases
  std::chrono::milliseconds connect_timeout{2000};
  // The cluster's agent token (sent as a bearer token; its announce key in AnnounceUrls), or
  // null for a tracker started with --insecure-open.
  std::shared_ptr<auth::ClientToken> token;
  // Chunk torrents announce over UDP (BEP 15: udp://host:port/announce?auth=<key>, one datagram
  // each way) to replicas given as http:// URLs; https:// replicas keep HTTPS announces.
  bool udp_announce = false;
  // Chunk torrents announce to the agent's announce relay (agent/announce_relay.h), which sends
  // them to the replicas in batches: replica r's announce URL is relay_url(r). Overrides
  // udp_announce. Unset: libtorrent announces to the replicas itself.
  std::function<std::string(size_t replica)> relay_url;
};

// How long to wait before asking the tracker again after the failed call e: a full tracker's
// Retry-After (kTooManyRequests), spread over 0.5x-1.5x so that the agents it shed do not come
// back together; otherwise 500 ms.
std::chrono::milliseconds TrackerRetryPause(const Error& e);

// Thread-affine: use from the agent's network thread.
class TrackerClient {
 public:
  TrackerClient(boost::asio::any_io_executor executor, TrackerClientOptions options);

  bool enabled() const { return !options_.trackers.empty(); }
  const std::string& agent_id() const { return options_.agent_id; }
  // Announce URLs of every replica (base + "/announce?auth=<announce key>", as udp://host:port
  // with udp_announce, the relay's with relay_url), in the order of --tracker. They change when
  // the token does (see token_generation), except the relay's.
  std::vector<std::string> AnnounceUrls() const;
  // The same URLs in Order(digest), those of replicas that failed their last call moved last: a
  // chunk torrent of that blob announces to its owner only, and to the next replica when the
  // owner fails (one tier each; lib/swarm).
  std::vector<std::string> AnnounceUrls(const Digest& digest) const;
  // From now on `replica`'s announce URL is its http:// one: UDP does not reach it while TCP
  // does (a firewall that lets TCP through but not UDP), as `why` says. Logged.
  void AnnounceOverHttp(size_t replica, std::string_view why);
  // Whether replica's announce URL is udp:// now.
  bool AnnouncesOverUdp(size_t replica) const;
  // Whether a call to replica succeeded within `within`.
  bool AnsweredWithin(size_t replica, std::chrono::milliseconds within) const;
  // Bumped when the token file gave a new token (re-checked every few seconds).
  uint64_t token_generation() const { return options_.token ? options_.token->generation() : 0; }
  // Replica indexes in the rendezvous order for digest (owner first).
  std::vector<size_t> Order(const Digest& digest) const;
  // The replica the blob calls for digest go to first now: the first in Order that did not fail
  // its last call (Order's first when every one failed).
  size_t Owner(const Digest& digest) const;
  // Whether calls or announces that try the replicas in `order` reach `replica` now, counting
  // `replica` itself as answering: it comes before every other replica of order that did not
  // fail its last call. A replica that just failed or just restarted is reached by the blobs
  // and chunk torrents it served, including those whose earlier replicas are down.
  bool Reaches(const std::vector<size_t>& order, size_t replica) const;
  // The replicas of announce URLs (matched by the part before '?'), in their order; URLs of no
  // replica are skipped.
  std::vector<size_t> ReplicasOf(const std::vector<std::string>& announce_urls) const;

  // Sends announce queries to replica (POST /v1/announces, tracker/swarms/batch.h): `lines` is
  // one query per line. Returns the reply lines (one per query, in order). Errors: kUnavailable
  // when the replica does not answer, kTooManyRequests when it is full, kProtocol or
  // kInvalidArgument/kDenied for another status (with its text).
  boost::asio::awaitable<Result<std::string>> AnnounceBatch(size_t replica, std::string lines);

  // Creates (or reads) the chunk table. Errors: kUnavailable when no replica answers,
  // kTooManyRequests when the owner replica is full (503 + Retry-After; retry_after_s set),
  // kProtocol for an answer we cannot use, kInvalidArgument/kDenied for a 4xx.
  boost::asio::awaitable<Result<ChunkTable>> Table(const Digest& digest, const BlobSource& source);
  // Reads a table without creating it; kNotFound when the tracker does not know the blob.
  boost::asio::awaitable<Result<ChunkTable>> FindTable(const Digest& digest);
  // Asks for chunk k: ready (metainfo), granted (we fetch it from upstream; only when
  // may_grant) or wait. With wait > 0 the tracker holds the request up to that long for a change.
  boost::asio::awaitable<Result<LeaseAnswer>> Lease(const Digest& digest, uint32_t k,
                                                    const BlobSource& source,
                                                    std::chrono::milliseconds wait,
                                                    bool may_grant = true);
  // Asks for upstream work on the blob: granted (a lease on the chunk the tracker picked),
  // wait, or done. Long-polls like Lease.
  boost::asio::awaitable<Result<LeaseAnswer>> Work(const Digest& digest, const BlobSource& source,
                                                   std::chrono::milliseconds wait);
  // One long-poll for a window of chunks (at most 64): answers with every one of them that is
  // ready as soon as any is, or with none after `wait`. Errors as Lease.
  boost::asio::awaitable<Result<ReadyAnswer>> Ready(const Digest& digest,
                                                    const std::vector<uint32_t>& chunks,
                                                    const BlobSource& source,
                                                    std::chrono::milliseconds wait);
  // Extends a lease. Errors: kDenied when the lease was lost (expired or re-granted).
  boost::asio::awaitable<Status> Renew(const Digest& digest, uint32_t k,
                                       const std::string& lease_id, uint64_t bytes);
  // Publishes chunk k's metainfo (releasing the lease when lease_id is not empty).
  boost::asio::awaitable<Status> Publish(const Digest& digest, uint32_t k, const BlobSource& source,
                                         const std::string& lease_id, const std::string& metainfo);
  // Gives a lease back after a failed upstream fetch.
  boost::asio::awaitable<Status> Release(const Digest& digest, uint32_t k,
                                         const std::string& lease_id);
  // Reports chunk metainfo whose data did not verify, so the tracker drops it and re-leases.
  boost::asio::awaitable<Status> ReportBad(const Digest& digest, uint32_t k,
                                           const std::string& info_hash_hex);

  // ---- The cluster-wide manifest cache (tracker/manifests/manifest_api.h). The owner replica is chosen by
  // rendezvous over "registry/repository:reference", so every agent asks the same one. ----

  // Asks for ref: found, fetch (we hold the lease) or wait. With wait > 0 the tracker holds the
  // request until the reference is published, the lease moves, or wait passes. Errors as Table.
  boost::asio::awaitable<Result<TrackerManifest>> ResolveManifest(const ManifestRef& ref,
                                                                  std::chrono::milliseconds wait);
  // Publishes a manifest fetched from upstream for ref (ending our lease on it).
  boost::asio::awaitable<Status> PublishManifest(const ManifestRef& ref,
                                                 const std::string& lease_id, const Digest& digest,
                                                 const std::string& media_type,
                                                 const std::string& body);
  // Gives our lease on ref back after a failed upstream fetch. A non-empty `missing` (the
  // upstream's 404 text) has the tracker answer "not found" to the cluster for a while.
  boost::asio::awaitable<Status> ReleaseManifest(const ManifestRef& ref,
                                                 const std::string& lease_id,
                                                 const std::string& missing = "");

  // ---- Cluster prefetch jobs. Unlike the calls above these go to one given replica: a job
  // lives on the replica that created it, so the agent polls every replica. ----

  // Replicas configured.
  size_t replicas() const { return options_.trackers.size(); }
  // A replica's base URL.
  std::string ReplicaUrl(size_t replica) const { return options_.trackers[replica].str(); }
  const http::Url& Replica(size_t replica) const { return options_.trackers[replica]; }
  // Registers this node (name, labels, and the port its swarm listens on unless 0, so that the
  // cluster view names the node behind its swarm peers) with the replica and waits up to `wait`
  // for jobs for it. Errors: kUnavailable when the replica does not answer, else as Table.
  boost::asio::awaitable<Result<std::vector<TrackerPrefetchJob>>> PollPrefetch(
      size_t replica, const std::string& node, const std::map<std::string, std::string>& labels,
      std::chrono::milliseconds wait, uint16_t swarm_port = 0);
  // Reports this node's progress on job `id` to the replica that holds it. Errors: kNotFound
  // (the replica forgot the job), kDenied (the part ended or belongs to another agent), ...
  boost::asio::awaitable<Status> ReportPrefetch(size_t replica, const std::string& id,
                                                const std::string& node,
                                                const TrackerPrefetchProgress& progress);

  // Whether no replica has answered any call for at least `grace`: callers then stop waiting
  // for the tracker and fall back at once (each blob no longer pays the grace on its own). A
  // background probe of every replica's /healthz, started by the first failure, ends this as
  // soon as one answers.
  bool Unreachable(std::chrono::milliseconds grace) const;
  // Replicas answering now (those that failed their last call are not counted).
  size_t healthy_replicas() const;

  // Called (on the network thread) when a replica answers with a tracker_id different from the
  // one it gave before: it restarted and lost its tables.
  void OnRestart(std::function<void(size_t replica)> callback) {
    on_restart_ = std::move(callback);
  }
  // Called (on the network thread) when a replica that answered fails a call, at most once a
  // minute per replica: the blobs it owned move to the next replicas.
  void OnFailing(std::function<void(size_t replica)> callback) {
    on_failing_ = std::move(callback);
  }

 private:
  struct Reply {
    unsigned status = 0;
    std::string body;
    size_t replica = 0;
  };
  // Sends to the replicas in digest's order until one answers (any HTTP status); a full one
  // (kTooManyRequests) ends the search: the next replica does not hold the blob's leases.
  boost::asio::awaitable<Result<Reply>> Call(const Digest& digest, boost::beast::http::verb method,
                                             std::string target, std::string body);
  // Sends to one replica. Errors: kUnavailable when it does not answer (or a proxy in front of
  // it answers 502..504), kTooManyRequests when it sheds the connection (503 + Retry-After).
  boost::asio::awaitable<Result<Reply>> CallReplica(size_t replica, boost::beast::http::verb method,
                                                    const std::string& target,
                                                    const std::string& body);
  // Records the replica's tracker id from a JSON answer's "tracker_id" (NoteTrackerIdValue) and
  // calls on_restart_ when it changed.
  void NoteTrackerId(size_t replica, const std::string& body);
  void NoteTrackerIdValue(size_t replica, const std::string& id);
  const std::string& Token() const { return options_.token->Current(); }
  // Records a replica's answer (ok) or silence, and starts the probe when none answers.
  void NoteHealth(size_t replica, bool ok);
  // Asks every replica's /healthz with a growing pause (0.5 s up to 5 s) until one answers.
  boost::asio::awaitable<void> Probe();

  using Clock = std::chrono::steady_clock;
  boost::asio::any_io_executor executor_;
  TrackerClientOptions options_;
  std::vector<std::string> tracker_ids_;  // per replica, last seen
  // Per replica: since when its calls fail (nullopt: its last call was answered).
  std::vector<std::optional<Clock::time_point>> failing_since_;
  std::vector<std::optional<Clock::time_point>> answered_at_;  // per replica, last good call
  std::vector<bool> http_announces_;  // per replica: UDP does not reach it (AnnounceOverHttp)
  // Since when every replica fails (nullopt: one answers).
  std::optional<Clock::time_point> all_failing_since_;
  bool probing_ = false;
  std::unique_ptr<http::Client> http_;
  std::function<void(size_t)> on_restart_;
  std::function<void(size_t)> on_failing_;
  std::vector<std::optional<Clock::time_point>> failing_noted_;  // when on_failing_ last ran
};

}  // namespace shoal::agent
