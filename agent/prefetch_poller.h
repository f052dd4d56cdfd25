#pragma once
// Cluster prefetch on the agent side: one long-poll loop per tracker replica asks for jobs for
// this node (registering its name and labels), runs each through the node Prefetcher and
// reports its progress back to the replica that holds the job (at most about once a second,
// and once when it ends).

#include <utility>

#include <chrono>
#include <map>
#include <set>
#include <string>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "agent/prefetch.h"
#include "agent/tracker_client.h"

namespace shoal::agent {

struct PrefetchPollerOptions {
  std::string node;                           // this node's name (--node-name)
  std::map<std::string, std::string> labels;  // --node-labels
  uint16_t swarm_port = 0;                    // where the swarm listens (0: no swarm)
  std::chrono::milliseconds wait{10'000};     // long-poll per request (the tracker caps it)
  std::chrono::milliseconds report_every{1'000};
};

// Network-thread only. tracker and prefetcher must outlive it.
class PrefetchPoller {
 public:
  PrefetchPoller(boost::asio::io_context& ioc, TrackerClient& tracker, Prefetcher& prefetcher,
                 PrefetchPollerOptions options);
  // Starts one poll loop per replica; they run until the io_context stops.
  void Start();

 private:
  boost::asio::awaitable<void> PollLoop(size_t replica);
  boost::asio::awaitable<void> Reporter(size_t replica, std::string id);
  void Run(size_t replica, const TrackerPrefetchJob& job);

  boost::asio::io_context& ioc_;
  TrackerClient& tracker_;
  Prefetcher& prefetcher_;
  PrefetchPollerOptions options_;
  std::set<std::string> seen_;  // job ids taken, so a job is never run twice
};

// The hostname (the node name when --node-name is not given).
std::string DefaultNodeName();
// Parses --node-labels entries "k=v" into a map. Errors: kInvalidArgument naming the entry.
Result<std::map<std::string, std::string>> ParseNodeLabels(const std::vector<std::string>& specs);

}  // namespace shoal::agent
