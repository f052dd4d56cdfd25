#pragma once
// AnnounceRelay: the agent's own loopback tracker for its libtorrent session, which forwards the
// session's announces to the tracker replicas in batches (`--tracker-announce batch`).
//
// Every chunk torrent is its own swarm, so a cold pull announces each chunk torrent on each node
// (started, completed, re-announces): at 2,500 nodes a tracker replica would get millions of
// datagrams in seconds, each costing it about 15 µs, almost all of it outside its tables. The
// relay takes each announce libtorrent sends to `http://127.0.0.1:<port>/announce/<replica>`,
// queues it per replica, and sends what is queued in one `POST /v1/announces`
// (tracker/swarms/batch.h) through the TrackerClient (agent token, replica health, tracker id).
// Each announce is answered with the bencoded reply the tracker gave it. While a batch is on its
// way the next one gathers. An announce that changes who seeds or needs a chunk (started, also a
// new seed's; completed; a chunk still downloading) goes with the next batch at once; stopped,
// paused and a seeder's periodic announces may wait up to `linger` for company. A batch the replica does not take fails
// each of its announces with a `failure reason`, and libtorrent moves to the chunk's next tier
// (the next replica, also through the relay).
//
// It listens on the swarm's own address (the node's, in a cluster) and serves only connections
// from that address or loopback (other sources are closed at accept), each with 5 s to send its
// request and at most 8,192 at once; each URL carries a random 128-bit key (`?auth=`) that only
// this process knows: nobody else, on the node or off it, can announce under the agent's token
// through it. Runs on the agent's network thread
// (single-threaded, like TrackerClient).

#include <utility>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/tracker_client.h"
#include "lib/core/error.h"

namespace shoal::agent {

struct AnnounceRelayOptions {
  // How long a stopped, paused or seeder's periodic announce may wait for others to share its
  // batch.
  std::chrono::milliseconds linger{1000};
  size_t max_batch = 512;  // the tracker's limit (kMaxBatchAnnounces)
};

class AnnounceRelay {
 public:
  // `tracker` must outlive the relay; Start() must be called before Url().
  AnnounceRelay(boost::asio::io_context& ioc, TrackerClient& tracker,
                AnnounceRelayOptions options = {});
  ~AnnounceRelay();
  AnnounceRelay(const AnnounceRelay&) = delete;
  AnnounceRelay& operator=(const AnnounceRelay&) = delete;

  // Listens on `address` (a port the OS picks) and starts serving. Use the address the swarm
  // listens on: libtorrent sends each announce from its listen socket's address, and a socket
  // bound to a node address cannot reach 127.0.0.1. Errors: kInvalidArgument for an address
  // that is not an IP, kUnavailable when it cannot listen.
  Status Start(const std::string& address = "127.0.0.1");
  // From now on no announce waits for company: what is queued and what comes leaves at once
  // (at shutdown, so that the session's `stopped` announces are not held for the linger).
  void SendAtOnce();
  // Stops listening and fails what is queued. Idempotent.
  void Stop();
  // The announce URL libtorrent is given for tracker replica r (http://<address>:<port>/announce/<r>,
  // the key in the query).
  std::string Url(size_t replica) const;
  uint16_t port() const { return port_; }

  struct Stats {
    uint64_t announces = 0;  // forwarded in batches the replica took
    uint64_t batches = 0;    // batches the replica took
    uint64_t failed = 0;     // announces answered with a failure (batch not taken, bad request)
    uint64_t refused = 0;    // connections closed at accept: another address, or too many
    uint64_t wait_us = 0;    // over the forwarded announces: from arrival to answer
    uint64_t max_wait_us = 0;
  };
  Stats stats() const { return stats_; }

 private:
  struct Pending;
  struct Queue;
  boost::asio::awaitable<void> AcceptLoop();
  boost::asio::awaitable<void> Serve(boost::asio::ip::tcp::socket socket);
  boost::asio::awaitable<void> SendLoop(size_t replica);
  // Logs what was relayed every minute it relayed something (info).
  boost::asio::awaitable<void> ReportLoop();
  // Logs (info) what was relayed between two samples of the stats.
  static void LogStats(const Stats& from, const Stats& to, std::string_view when);

  boost::asio::io_context& ioc_;
  TrackerClient& tracker_;
  AnnounceRelayOptions options_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::string host_;  // the listen address as it goes in a URL ([v6])
  std::string key_;
  std::vector<std::unique_ptr<Queue>> queues_;  // per replica
  size_t connections_ = 0;  // being served now
  bool at_once_ = false;    // SendAtOnce was called
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  Stats stats_;
};

}  // namespace shoal::agent
