#include "agent/prefetch_poller.h"

#include <unistd.h>

#include <algorithm>

#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "agent/sleep.h"

namespace shoal::agent {
namespace asio = boost::asio;
using asio::awaitable;

namespace {

TrackerPrefetchProgress ProgressOf(const PrefetchJob& job) {
  TrackerPrefetchProgress p;
  p.state = job.state == PrefetchJob::State::kRunning ? "running"
            : job.state == PrefetchJob::State::kDone  ? "done"
                                                      : "failed";
  p.error = job.error;
  for (const auto& b : job.blobs) {
    p.bytes_total += b.size;
    p.bytes_done += std::min(b.done, b.size);
    p.blobs_done += b.state == PrefetchBlob::State::kDone;
  }
  p.blobs_total = job.blobs.size();
  return p;
}

}  // namespace

std::string DefaultNodeName() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

Result<std::map<std::string, std::string>> ParseNodeLabels(const std::vector<std::string>& specs) {
  std::map<std::string, std::string> out;
  for (const auto& spec : specs) {
    if (spec.empty()) continue;
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "--node-labels entry \"" + spec + "\" is not KEY=VALUE");
    }
    out[spec.substr(0, eq)] = spec.substr(eq + 1);
  }
  return out;
}

PrefetchPoller::PrefetchPoller(asio::io_context& ioc, TrackerClient& tracker,
                               Prefetcher& prefetcher, PrefetchPollerOptions options)
    : ioc_(ioc), tracker_(tracker), prefetcher_(prefetcher), options_(std::move(options)) {}

void PrefetchPoller::Start() {
  for (size_t r = 0; r < tracker_.replicas(); ++r) {
    asio::co_spawn(ioc_, PollLoop(r), asio::detached);
  }
}

awaitable<void> PrefetchPoller::PollLoop(size_t replica) {
  std::chrono::milliseconds backoff{500};
  bool failing = false;
  for (;;) {
    auto jobs = co_await tracker_.PollPrefetch(replica, options_.node, options_.labels,
                                               options_.wait, options_.swarm_port);
    if (!jobs) {
      if (!failing) {
        spdlog::warn("prefetch: polling tracker {} failed: {}", tracker_.ReplicaUrl(replica),
                     jobs.error().ToString());
      }
      failing = true;
      co_await SleepFor(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(10'000));
      continue;
    }
    if (failing) spdlog::info("prefetch: tracker {} answers again", tracker_.ReplicaUrl(replica));
    failing = false;
    backoff = std::chrono::milliseconds(500);
    for (const auto& job : jobs.value()) Run(replica, job);
  }
}

void PrefetchPoller::Run(size_t replica, const TrackerPrefetchJob& job) {
  if (!seen_.insert(job.id).second) return;
  PrefetchRequest request;
  request.images = job.images;
  request.platform = job.platform;
  request.ttl = std::chrono::seconds(job.ttl_s);
  request.parallel = job.parallel;
  request.snapshots = job.snapshots;
  spdlog::info("prefetch: job {} from tracker {}: {} images", job.id, tracker_.ReplicaUrl(replica),
               job.images.size());
  auto started = prefetcher_.Start(std::move(request), job.id);
  if (!started) {
    // Say why at once; nothing runs.
    TrackerPrefetchProgress failed;
    failed.state = "failed";
    failed.error = started.error().ToString();
    auto report = [this, replica, id = job.id, failed]() -> awaitable<void> {
      auto st = co_await tracker_.ReportPrefetch(replica, id, options_.node, failed);
      if (!st) spdlog::warn("prefetch: report on {}: {}", id, st.error().ToString());
    };
    asio::co_spawn(ioc_, report, asio::detached);
    return;
  }
  asio::co_spawn(ioc_, Reporter(replica, job.id), asio::detached);
}

awaitable<void> PrefetchPoller::Reporter(size_t replica, std::string id) {
  uint64_t sent_version = 0;
  int failures = 0;
  for (;;) {
    auto job = prefetcher_.Find(id);
    if (!job) co_return;
    const uint64_t version = job->version;
    const bool ended = job->state != PrefetchJob::State::kRunning;
    const TrackerPrefetchProgress progress = ProgressOf(*job);
    Status st = co_await tracker_.ReportPrefetch(replica, id, options_.node, progress);
    if (!st) {
      // The replica forgot the job, or the part was failed or taken meanwhile: stop reporting.
      if (st.error().code == ErrorCode::kNotFound || st.error().code == ErrorCode::kDenied ||
          st.error().code == ErrorCode::kInvalidArgument || ++failures >= 30) {
        spdlog::warn("prefetch: giving up reporting job {}: {}", id, st.error().ToString());
        co_return;
      }
      co_await SleepFor(options_.report_every);
      continue;
    }
    failures = 0;
    sent_version = version;
    if (ended) co_return;
    co_await SleepFor(options_.report_every);
    co_await prefetcher_.WaitChange(id, sent_version, std::chrono::seconds(5));
  }
}

}  // namespace shoal::agent
