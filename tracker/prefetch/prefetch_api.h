#pragma once
// The tracker's prefetch API: cluster-wide prefetch jobs (tracker/prefetch/prefetch_jobs.h) as JSON
// over HTTP under /v1/prefetch. Operators (shoalctl prefetch --cluster) create and watch jobs;
// agents long-poll for their part and report progress:
//   POST /v1/prefetch/jobs {"images":[...],"platform","ttl_s","parallel","snapshots","nodes":[...],
//                            "selector":{"k":"v"} or "k=v,...","percent","timeout_s"} -> 201 job
//   GET  /v1/prefetch/jobs                        -> {"jobs":[job without nodes]}
//   GET  /v1/prefetch/jobs/{id}?wait_ms=N&since=V -> job (long-polls until version > V)
//   POST /v1/prefetch/poll?wait_ms=N&swarm_port=P  {"agent","node","labels":{}}
//        -> {"jobs":[assignment]} (registers the agent, and with swarm_port where its swarm
//        listens; long-polls until a job for the node arrives)
//   PUT  /v1/prefetch/jobs/{id}/nodes/{node}  {"agent","state","error","bytes_done",
//                                              "bytes_total","blobs_done","blobs_total"}
//   GET  /v1/prefetch/agents                      -> {"agents":[...]} (live ones)
// A job lives on the replica that created it; agents poll every replica (see
// docs/architecture.md, "Prefetch"). Every answer carries the tracker_id.

#include <utility>

#include <chrono>
#include <cstddef>
#include <random>
#include <map>
#include <string>
#include <vector>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <boost/asio/awaitable.hpp>
#include <nlohmann/json_fwd.hpp>

#include "tracker/blobs/blob_api.h"
#include "tracker/lease_waiters.h"
#include "tracker/prefetch/prefetch_jobs.h"

namespace shoal::tracker {

struct PrefetchApiOptions {
  PrefetchJobsOptions jobs;
  std::chrono::milliseconds max_wait{10'000};  // wait_ms is capped to this
  size_t max_waiters = 10'000;                 // beyond, long-polls are answered at once
};

// One node's part of a job as JSON: node, state, bytes/blobs done and total, elapsed_ms, agent,
// error (docs/api.md).
nlohmann::json PrefetchNodeJson(const PrefetchNode& node, TimePoint now);
// A job as JSON (id, state, images, totals over its nodes, ...); with_nodes adds every node.
nlohmann::json PrefetchJobJson(const PrefetchJobRecord& job, TimePoint now, bool with_nodes);

// Not thread-safe: runs on the server's single io_context thread. Requests and answers reuse
// BlobRequest and BlobResponse.
class PrefetchApi {
 public:
  // Registers its metrics on registry, which must outlive the API. seed feeds job ids.
  PrefetchApi(PrefetchApiOptions options, prometheus::Registry& registry, std::string tracker_id,
              uint64_t seed = std::random_device{}());

  // Whether the server routes path here (/v1/prefetch and everything below it).
  static bool Owns(std::string_view path);
  // Answers req; polls and job reads with wait_ms > 0 long-poll.
  boost::asio::awaitable<BlobResponse> Handle(BlobRequest req);
  // Answers req as of now without waiting.
  BlobResponse HandleNow(const BlobRequest& req, TimePoint now);
  // Makes every parked long-poll answer now and later ones answer at once (shutdown).
  void Shutdown();
  // Fails parts of gone agents and timed-out jobs, drops old jobs, refreshes the gauges.
  void Sweep(TimePoint now);
  // Plain-text lines for the status page.
  std::string StatusSection(TimePoint now) const;

  const PrefetchJobs& jobs() const { return jobs_; }

  // A validated request (defined in prefetch_api.cc).
  struct Call;

 private:
  BlobResponse Execute(const Call& call, TimePoint now);
  BlobResponse Json(unsigned status, nlohmann::json body) const;
  BlobResponse Error(unsigned status, std::string message) const;
  void Count(const BlobResponse& response, std::string_view route);
  void Wake(const std::vector<std::string>& job_ids);
  void MaybeSweep(TimePoint now);

  PrefetchApiOptions options_;
  std::string tracker_id_;
  PrefetchJobs jobs_;
  LeaseWaiters waiters_;
  bool stopping_ = false;
  TimePoint last_sweep_{};
  prometheus::Family<prometheus::Counter>& requests_;  // shoal_tracker_prefetch_requests_total
  prometheus::Counter& created_;                       // shoal_tracker_prefetch_jobs_created_total
  prometheus::Family<prometheus::Gauge>& job_gauge_;   // shoal_tracker_prefetch_jobs{state}
  prometheus::Family<prometheus::Gauge>& node_gauge_;  // shoal_tracker_prefetch_nodes{state}
  prometheus::Gauge& agents_;                          // shoal_tracker_prefetch_agents
  // shoal_tracker_prefetch_job_nodes{prefetch_job,state} and
  // shoal_tracker_prefetch_job_bytes{prefetch_job,kind}: the progress of the kJobGauges newest
  // jobs (older jobs' series are removed, so the label set stays bounded). Labelled by job id,
  // not image: /metrics answers anyone, and image names are for operators (tracker/access.h).
  static constexpr size_t kJobGauges = 10;
  prometheus::Family<prometheus::Gauge>& job_nodes_;
  prometheus::Family<prometheus::Gauge>& job_bytes_;
  std::map<std::string, std::vector<prometheus::Gauge*>> job_series_;  // by job id
  void UpdateJobGauges();
};

}  // namespace shoal::tracker
