// shoal-bench-tracker: 2,500 simulated agents against one real shoal-tracker process, and
// opentracker under the same announce workload in the same run. Not a test: never registered
// with ctest, never gates CI (docs/benchmarks.md has a run and how to read it).
//
// The image: a 17 GB layer mix (one ~10 GB layer, a few GB-sized ones, many small ones). Its
// chunk tables come from the tracker itself (POST /v1/blobs/<digest>, as agents ask), so the
// chunk sizes and counts are the tracker's defaults. Each chunk's torrent is a real private v1
// SSL chunk torrent (BuildChunkTorrent with the test cluster's peer CA) over FAKE piece hashes:
// the tracker validates structure and the CA, never content, so this is honest for a tracker
// benchmark and costs no hashing.
//
// Each simulated agent is a distinct peer: its own peer_id, and its own source address
// 127.10.x.y (all of 127/8 is loopback on Linux), which is what the tracker keys peers on
// (the TCP source address and the announced port; ip= is ignored by default). Announces are
// sent as libtorrent 2.0 sends them: the same query parameters, numwant=200, the agent token's
// announce key as auth=, and "Connection: close" (libtorrent's http_connection closes after
// every tracker request), so every announce is a new TCP connection. Blob API calls carry the
// agent's bearer token over keep-alive connections (the agent's HTTP client pools up to 8 idle
// connections per host; a long-poll holds a connection of its own).
//
// --transport udp sends every announce as the agent does by default instead (BEP 15, as
// libtorrent 2.0.8's udp_tracker_connection does): a connect first unless the agent holds a
// connection id from that tracker younger than 60 s, then one announce datagram (numwant 200,
// shoal's announce key as BEP 41 URL data) from a socket bound to the agent's address;
// opentracker gets the same datagrams on a UDP port of its own.
//
// Phases (each bounded in time and count):
//   a  cold cluster-wide pull (shoal only): every agent creates the chunk tables, its upstream
//      worker long-polls for work (POST .../work?wait_ms=5000), leased agents "fetch" the chunk
//      (a delay at the upstream link's share), renew every ttl/3 and publish the metainfo; its
//      window workers wait for their chunks, for which one watcher per blob long-polls (POST
//      .../ready?wait_ms=5000 with the 16 lowest chunks not held or known ready), announce
//      started when it is ready, "download" it over a 10 Gbit/s node link (a delay) and announce
//      completed. Like the agent, an answer that fails is retried after 500 ms and a chunk without
//      a usable tracker answer for 10 s is counted as a fallback to upstream.
//   c  closed loop: the most announces/s, every (agent, chunk torrent) pair once in a shuffled
//      order (this also registers every peer for phase b), with --concurrency requests in flight.
//   b  steady state, open loop: 2,500 agents re-announcing every chunk torrent at the tracker's
//      interval (300 s + up to 10% jitter: a mean of 315 s), at a fixed arrival schedule;
//      latency counts from the scheduled time, so queueing shows. --rates runs multiples of it.

#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <utility>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/endian/conversion.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "lib/auth/tokens.h"
#include "lib/core/base64.h"
#include "lib/core/digest.h"
#include "lib/core/sha256.h"
#include "lib/swarm/chunk_torrent.h"
#include "tests/support/http_client.h"
#include "tests/support/proc_stats.h"
#include "tests/support/process.h"
#include "tests/support/tokens.h"

namespace shoal::testkit {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace fs = std::filesystem;
using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;
using udp = asio::ip::udp;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using std::chrono::milliseconds;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---- Options -----------------------------------------------------------------------------------

struct Options {
  int agents = 2500;
  double image_gb = 17;  // decimal GB, as images are quoted
  std::string phases = "a,c,b";
  std::vector<double> rates = {0.25, 0.5, 1};  // phase b: multiples of the 2,500-node load
  double steady_seconds = 30;                  // phase b, per rate
  double closed_seconds = 120;                 // phase c (which also registers every peer for b)
  double keepalive_seconds = 30;               // phase c over keep-alive connections
  int concurrency = 128;                       // phase c: requests in flight
  bool keepalive = true;        // phase c again over keep-alive connections (shoal only)
  int batch = 64;               // phase c again in POST /v1/announces batches of this many (0: no)
  double batch_seconds = 30;    // phase c in batches
  double cold_seconds = 180;    // phase a
  double start_spread_s = 5;    // phase a: agents start over this long
  int parallel_blobs = 3;       // phase a: layers an agent pulls at once (containerd: 3)
  int window = 4;               // phase a: the agent's --range-streams
  double node_gbit = 10;        // phase a: each node's link
  double upstream_gbit = 10;    // phase a: the NAT link, shared by the leases
  int max_fetchers = 8;         // the tracker's --max-upstream-fetchers default
  int threads = 2;              // generator threads
  int timeout_ms = 10000;       // announce timeout
  size_t max_inflight = 30000;  // phase b: beyond, a scheduled request is dropped (counted)
  bool pin = true;              // trackers on CPU 0, the generator on the others
  bool notrack = true;          // no conntrack entries for 127.10.0.0/16 (iptables raw)
  bool opentracker = true;
  std::string transport = "http";  // announces over "http" (a connection each) or "udp" (BEP 15)
  std::string opentracker_bin = "/usr/bin/opentracker";
  std::string tracker_bin = SHOAL_TRACKER_BIN;
  std::vector<std::string> tracker_args;
  std::string json_out;
  uint64_t seed = 1;
};

// ---- Ctrl-C: stop the phases, stop the children
// --------------------------------------------------

std::atomic<bool> g_stop{false};

// Undo commands (the NOTRACK rules), run once at any exit.
std::mutex g_cleanup_mu;
std::vector<std::vector<std::string>> g_cleanup;

void RunCleanup() {
  std::vector<std::vector<std::string>> cmds;
  {
    std::lock_guard<std::mutex> lock(g_cleanup_mu);
    cmds.swap(g_cleanup);
  }
  for (auto& c : cmds) {
    auto r = RunCommand(c, std::chrono::seconds(20));
    if (!r) std::fprintf(stderr, "cleanup failed: %s\n", r.error().message.c_str());
  }
}

// Every connection-close announce leaves a conntrack entry in TIME_WAIT for 120 s; at thousands
// a second the table (nf_conntrack_max) fills and the kernel drops SYNs, which measures the
// firewall, not the tracker. The benchmark's own addresses (127.10.0.0/16) skip conntrack.
std::string AddNoTrack() {
  std::vector<std::vector<std::string>> rules = {
      {"OUTPUT", "-s"}, {"OUTPUT", "-d"}, {"PREROUTING", "-s"}, {"PREROUTING", "-d"}};
  for (auto& r : rules) {
    std::vector<std::string> args = {"iptables", "-w",      "-t",        "raw",
                                     "-I",       r[0],      r[1],        "127.10.0.0/16",
                                     "-m",       "comment", "--comment", "shoal-bench-tracker",
                                     "-j",       "NOTRACK"};
    auto out = RunCommand(args, std::chrono::seconds(20));
    if (!out) return "could not add NOTRACK rules (" + out.error().message + ")";
    args[4] = "-D";
    std::lock_guard<std::mutex> lock(g_cleanup_mu);
    g_cleanup.push_back(args);
  }
  return "";
}

uint64_t ConntrackCount() {
  std::string s = ReadFile("/proc/sys/net/netfilter/nf_conntrack_count");
  return s.empty() ? 0 : std::stoull(s);
}

// ---- Statistics ---------------------------------------------------------------------------------

enum Kind {
  kAnnStarted,
  kAnnCompleted,
  kAnnPeriodic,
  kTable,
  kWork,
  kReady,
  kRenew,
  kPublish,
  kRelease,
  kKinds
};
constexpr const char* kKindName[kKinds] = {"announce started",
                                           "announce completed",
                                           "announce (periodic)",
                                           "table (POST blob)",
                                           "work (long-poll)",
                                           "ready (long-poll)",
                                           "renew",
                                           "publish",
                                           "release"};
constexpr const char* kKindKey[kKinds] = {"announce_started",
                                          "announce_completed",
                                          "announce",
                                          "table",
                                          "work",
                                          "ready",
                                          "renew",
                                          "publish",
                                          "release"};

enum Err {
  kErrStatus,
  kErrFailure,
  kErrConnect,
  kErrIo,
  kErrTimeout,
  kErrDropped,
  kErrLocal,
  kErrs
};
constexpr const char* kErrName[kErrs] = {"non-200",
                                         "failure reason",
                                         "connect",
                                         "read/write",
                                         "timeout",
                                         "dropped (generator cap)",
                                         "generator socket (fd limit)"};

struct KindStats {
  uint64_t ok = 0;
  std::array<uint64_t, kErrs> errors{};
  std::map<unsigned, uint64_t> statuses;  // non-200 statuses
  std::vector<uint32_t> latency_us;       // every answered request (ok or not)
  uint64_t peers = 0;                     // announces: peers returned
};

struct Stats {
  std::array<KindStats, kKinds> k;
  // Phase a.
  uint64_t granted = 0, work_done = 0, work_wait = 0, lease_ready = 0, lease_wait = 0;
  uint64_t chunk_fallbacks = 0, blob_fallbacks = 0, chunks_from_peers = 0, chunks_upstream = 0;
  uint64_t lost_leases = 0;
  std::vector<double> agent_done_s;
  std::vector<uint32_t> lag_us;  // how late the generator's 50 ms probe timer fired

  void Merge(const Stats& o) {
    for (int i = 0; i < kKinds; ++i) {
      k[i].ok += o.k[i].ok;
      for (int e = 0; e < kErrs; ++e) k[i].errors[e] += o.k[i].errors[e];
      for (auto [s, n] : o.k[i].statuses) k[i].statuses[s] += n;
      k[i].latency_us.insert(k[i].latency_us.end(), o.k[i].latency_us.begin(),
                             o.k[i].latency_us.end());
      k[i].peers += o.k[i].peers;
    }
    granted += o.granted;
    work_done += o.work_done;
    work_wait += o.work_wait;
    lease_ready += o.lease_ready;
    lease_wait += o.lease_wait;
    chunk_fallbacks += o.chunk_fallbacks;
    blob_fallbacks += o.blob_fallbacks;
    chunks_from_peers += o.chunks_from_peers;
    chunks_upstream += o.chunks_upstream;
    lost_leases += o.lost_leases;
    agent_done_s.insert(agent_done_s.end(), o.agent_done_s.begin(), o.agent_done_s.end());
    lag_us.insert(lag_us.end(), o.lag_us.begin(), o.lag_us.end());
  }
};

double Percentile(std::vector<uint32_t>& v, double p) {
  if (v.empty()) return 0;
  size_t i = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size()))) - 1;
  i = std::min(i, v.size() - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i] / 1000.0;  // ms
}

uint64_t Errors(const KindStats& s) {
  uint64_t n = 0;
  for (uint64_t e : s.errors) n += e;
  return n;
}

// ---- The image and its chunk torrents -----------------------------------------------------------

struct Chunk {
  uint32_t blob = 0, k = 0;
  uint64_t length = 0;
  std::string metainfo;    // bencoded, as a leased agent would publish it
  std::string ih_bytes;    // 20 raw bytes
  std::string ih_escaped;  // percent-encoded for the query
};

struct Blob {
  Digest digest = Digest::FromSha256Hex(std::string(64, '0'));
  uint64_t size = 0;
  swarm::ChunkLayout layout;
  std::vector<uint32_t> chunks;  // indexes into Image::chunks
};

struct Image {
  std::vector<Blob> blobs;
  std::vector<Chunk> chunks;
  uint64_t bytes = 0;
};

// Layer sizes of a large ML image, as fractions of the whole: one ~10 GB layer, three GB-sized,
// a few hundreds of MB, many small ones (and the config blob).
std::vector<uint64_t> LayerSizes(double image_gb) {
  const std::vector<double> mb = {10000, 1500, 1500, 1500, 700, 700, 200, 200, 200,
                                  200,   50,   50,   50,   50,  50,  12,  9,   7,
                                  5,     4,    3,    2,    1.5, 1,   0.5, 0.2, 0.02};
  double total = std::accumulate(mb.begin(), mb.end(), 0.0);
  std::vector<uint64_t> out;
  for (double m : mb) {
    out.push_back(std::max<uint64_t>(1024, static_cast<uint64_t>(m / total * image_gb * 1e9)));
  }
  return out;
}

std::string Escape(std::string_view bytes) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : bytes) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

// ---- Agents -------------------------------------------------------------------------------------

struct Agent {
  uint32_t id = 0;
  asio::ip::address_v4 address;
  std::string name;         // agent id in blob API bodies
  std::string peer_id_esc;  // percent-encoded 20-byte peer_id
  std::string key;          // the announce's key=
  // Phase a.
  // Idle keep-alive connections, with the time each went idle.
  std::vector<std::pair<std::unique_ptr<beast::tcp_stream>, Clock::time_point>> pool;
  Clock::time_point link_free{};  // the node link's FIFO
  uint32_t next_blob = 0;
  // UDP announces: the connection id each tracker (0 shoal, 1 opentracker) handed this agent,
  // and when; libtorrent reuses one for 60 s.
  mutable std::array<std::pair<uint64_t, Clock::time_point>, 2> udp_ids{};
};

asio::ip::address_v4 AgentAddress(uint32_t i) {
  return asio::ip::address_v4((127u << 24) | (10u << 16) | ((i / 250) << 8) | (i % 250 + 1));
}

// ---- One generator thread ----------------------------------------------------------------------

struct Target {
  std::string name;  // "shoal" or "opentracker"
  tcp::endpoint ep;
  std::string host;           // Host header
  std::string announce_base;  // "/announce?auth=KEY&" or "/announce?"
  std::string bearer;         // Authorization for the blob API
  // UDP announces (--transport udp): where, the BEP 41 URL data ("/announce?auth=KEY" or ""),
  // and this tracker's slot in Agent::udp_ids.
  bool udp = false;
  udp::endpoint udp_ep;
  std::string url_data;
  size_t udp_slot = 0;
};

struct Reply {
  bool answered = false;  // a whole response arrived
  bool reusable = false;  // HTTP: answered, and the server keeps the connection open
  Err err = kErrIo;       // why, when not answered
  unsigned status = 0;
  std::string body;
};

class Gen {
 public:
  Gen() : work_(asio::make_work_guard(ioc_)) {}
  asio::io_context& ioc() { return ioc_; }
  Stats& stats() { return stats_; }
  size_t inflight = 0;

  void Start() {
    // The event loop's lag: when this thread is short of CPU, every latency it measures grows.
    asio::co_spawn(
        ioc_,
        [this]() -> awaitable<void> {
          asio::steady_timer timer(ioc_);
          auto next = Clock::now();
          while (!stopping_) {
            next += milliseconds(50);
            timer.expires_at(next);
            beast::error_code ec;
            co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
            auto late = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - next);
            stats_.lag_us.push_back(static_cast<uint32_t>(std::max<int64_t>(0, late.count())));
            if (Clock::now() > next) next = Clock::now();
          }
        },
        asio::detached);
    thread_ = std::thread([this] { ioc_.run(); });
  }
  void Finish() {
    Run([this] { stopping_ = true; });
    work_.reset();
    if (thread_.joinable()) thread_.join();
  }
  // Runs fn on this thread and waits for it.
  template <typename F>
  void Run(F fn) {
    std::promise<void> done;
    auto fut = done.get_future();
    asio::post(ioc_, [&] {
      fn();
      done.set_value();
    });
    fut.wait();
  }
  Stats TakeStats() {
    Stats out;
    Run([&] { std::swap(out, stats_); });
    return out;
  }

 private:
  asio::io_context ioc_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
  Stats stats_;
  bool stopping_ = false;
};

void Record(KindStats& s, const Reply& r, Clock::time_point since) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - since).count();
  if (r.answered) s.latency_us.push_back(static_cast<uint32_t>(std::min<int64_t>(us, UINT32_MAX)));
  if (!r.answered) {
    ++s.errors[r.err];
  } else if (r.status != 200) {
    ++s.errors[kErrStatus];
    ++s.statuses[r.status];
  }
}

std::atomic<uint64_t> g_fd_waits{0};

// Opens a socket bound to `from` (port chosen at connect, so 4-tuples, not ports, must be unique).
awaitable<std::optional<Err>> Connect(beast::tcp_stream& stream, const asio::ip::address_v4& from,
                                      const tcp::endpoint& to, milliseconds timeout) {
  beast::error_code ec;
  stream.socket().open(tcp::v4(), ec);
  // Out of descriptors (RLIMIT_NOFILE): a limit of this one process, where a real cluster has a
  // process per node. Wait for one (the time counts in the request's latency), do not fail.
  for (auto until = Clock::now() + timeout;
       (ec == asio::error::no_descriptors || ec.value() == ENFILE) && Clock::now() < until;) {
    ++g_fd_waits;
    asio::steady_timer timer(stream.get_executor());
    timer.expires_after(milliseconds(10));
    beast::error_code tec;
    co_await timer.async_wait(asio::redirect_error(use_awaitable, tec));
    ec = {};
    stream.socket().open(tcp::v4(), ec);
  }
  if (!ec) {
    int one = 1;
    ::setsockopt(stream.socket().native_handle(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one,
                 sizeof(one));
    stream.socket().bind(tcp::endpoint(from, 0), ec);
  }
  if (ec) co_return kErrLocal;  // EMFILE and the like: the generator's limit, not the tracker's
  stream.expires_after(timeout);
  co_await stream.async_connect(to, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return ec == beast::error::timeout ? kErrTimeout : kErrConnect;
  stream.socket().set_option(tcp::no_delay(true), ec);
  co_return std::nullopt;
}

template <typename Body>
awaitable<Reply> Exchange(beast::tcp_stream& stream, http::request<Body>& req,
                          milliseconds timeout) {
  Reply r;
  beast::error_code ec;
  stream.expires_after(timeout);
  co_await http::async_write(stream, req, asio::redirect_error(use_awaitable, ec));
  if (ec) {
    r.err = ec == beast::error::timeout ? kErrTimeout : kErrIo;
    co_return r;
  }
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1 << 20);
  co_await http::async_read(stream, buffer, parser, asio::redirect_error(use_awaitable, ec));
  if (ec) {
    r.err = ec == beast::error::timeout ? kErrTimeout : kErrIo;
    co_return r;
  }
  r.answered = true;
  r.status = parser.get().result_int();
  r.body = std::move(parser.get().body());
  r.reusable = parser.get().keep_alive();
  co_return r;
}

// The number in "5:peers<len>:" of a compact announce reply (6 bytes a peer), or 0.
uint64_t CompactPeers(const std::string& body) {
  size_t at = body.find("5:peers");
  if (at == std::string::npos) return 0;
  at += 7;
  uint64_t len = 0;
  while (at < body.size() && body[at] >= '0' && body[at] <= '9')
    len = len * 10 + (body[at++] - '0');
  return len / 6;
}

enum class Event { kNone, kStarted, kCompleted };

template <typename T>
void PutBe(std::string& out, T v) {
  v = boost::endian::native_to_big(v);
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
uint32_t GetBe32(const std::string& in, size_t at) {
  uint32_t v;
  std::memcpy(&v, in.data() + at, 4);
  return boost::endian::big_to_native(v);
}

// One datagram to `to` from a socket bound to `from`, and the answer with the same transaction
// id (or a timeout). The socket lives in a shared_ptr: the timer's handler may run after this
// coroutine is gone.
awaitable<Reply> UdpRoundTrip(Gen& g, const asio::ip::address_v4& from, const udp::endpoint& to,
                              const std::string& datagram, uint32_t transaction,
                              milliseconds timeout) {
  Reply r;
  auto sock = std::make_shared<udp::socket>(g.ioc());
  beast::error_code ec;
  sock->open(udp::v4(), ec);
  if (!ec) sock->bind(udp::endpoint(from, 0), ec);
  if (ec) {
    r.err = kErrLocal;
    co_return r;
  }
  co_await sock->async_send_to(asio::buffer(datagram), to,
                               asio::redirect_error(use_awaitable, ec));
  if (ec) {
    r.err = kErrIo;
    co_return r;
  }
  asio::steady_timer timer(g.ioc());
  timer.expires_after(timeout);
  bool timed_out = false;
  timer.async_wait([sock, &timed_out](beast::error_code tec) {
    if (tec) return;
    timed_out = true;
    beast::error_code cec;
    sock->cancel(cec);
  });
  std::string buf(2048, '\0');
  for (;;) {
    size_t n = co_await sock->async_receive(asio::buffer(buf),
                                            asio::redirect_error(use_awaitable, ec));
    if (ec) {
      r.err = timed_out ? kErrTimeout : kErrIo;
      break;
    }
    if (n < 8 || GetBe32(buf, 4) != transaction) continue;  // a late answer to another try
    buf.resize(n);
    r.answered = true;
    r.status = 200;  // the caller tells an error answer (action 3) from the rest
    r.body = std::move(buf);
    break;
  }
  timer.cancel();
  sock->close(ec);
  co_return r;
}

// One announce over UDP as libtorrent 2.0.8 sends it: a connect first unless the agent holds an
// id from this tracker younger than 60 s, then the announce (numwant 200, the key as BEP 41
// URL data). The latency counts both round trips when there are two.
awaitable<Reply> AnnounceUdp(Gen& g, const Target& t, const Agent& a, const Chunk& c,
                             Event event, uint64_t left, milliseconds timeout) {
  static thread_local std::mt19937 rng{std::random_device{}()};
  auto& [id, at] = a.udp_ids[t.udp_slot];
  if (at == Clock::time_point{} || Clock::now() - at > std::chrono::seconds(60)) {
    const uint32_t tx = static_cast<uint32_t>(rng());
    std::string connect;
    PutBe<uint64_t>(connect, 0x41727101980ULL);
    PutBe<uint32_t>(connect, 0);
    PutBe<uint32_t>(connect, tx);
    Reply r = co_await UdpRoundTrip(g, a.address, t.udp_ep, connect, tx, timeout);
    if (!r.answered || GetBe32(r.body, 0) != 0 || r.body.size() < 16) co_return r;
    uint64_t v;
    std::memcpy(&v, r.body.data() + 8, 8);
    id = boost::endian::big_to_native(v);
    at = Clock::now();
  }
  const uint32_t tx = static_cast<uint32_t>(rng());
  std::string d;
  d.reserve(160);
  PutBe<uint64_t>(d, id);
  PutBe<uint32_t>(d, 1);
  PutBe<uint32_t>(d, tx);
  d += c.ih_bytes;
  // The peer id: "-LT2080-" and the agent's number, as in the HTTP announces.
  d += fmt::format("-LT2080-{:012d}", a.id);
  PutBe<uint64_t>(d, c.length - left);  // downloaded
  PutBe<uint64_t>(d, left);
  PutBe<uint64_t>(d, 0);  // uploaded
  PutBe<uint32_t>(d, event == Event::kCompleted ? 1 : event == Event::kStarted ? 2 : 0);
  PutBe<uint32_t>(d, 0);  // ip
  PutBe<uint32_t>(d, a.id * 2654435761u);  // key
  PutBe<uint32_t>(d, 200);                 // num_want
  PutBe<uint16_t>(d, 6881);
  if (!t.url_data.empty()) {
    d += char(2);
    d += static_cast<char>(t.url_data.size());
    d += t.url_data;
  }
  Reply r = co_await UdpRoundTrip(g, a.address, t.udp_ep, d, tx, timeout);
  if (r.answered && GetBe32(r.body, 0) == 3) {
    at = {};  // an error (say, an expired id): connect again next time
  }
  co_return r;
}

// One announce as libtorrent 2.0 sends it, on a connection of its own ("Connection: close").
awaitable<void> Announce(Gen& g, const Target& t, const Agent& a, const Chunk& c, Event event,
                         uint64_t left, Clock::time_point since, milliseconds timeout) {
  std::string target = t.announce_base;
  target.reserve(400);
  target += "info_hash=";
  target += c.ih_escaped;
  target += "&peer_id=";
  target += a.peer_id_esc;
  target += "&port=6881&uploaded=0&downloaded=";
  target += std::to_string(c.length - left);
  target += "&left=";
  target += std::to_string(left);
  target += "&corrupt=0&key=";
  target += a.key;
  if (event == Event::kStarted) target += "&event=started";
  if (event == Event::kCompleted) target += "&event=completed";
  target += "&numwant=200&compact=1&no_peer_id=1&supportcrypto=1&redundant=0";
  Kind kind = event == Event::kStarted     ? kAnnStarted
              : event == Event::kCompleted ? kAnnCompleted
                                           : kAnnPeriodic;
  KindStats& s = g.stats().k[kind];
  if (t.udp) {
    Reply r = co_await AnnounceUdp(g, t, a, c, event, left, timeout);
    Record(s, r, since);
    if (r.answered && GetBe32(r.body, 0) == 1 && r.body.size() >= 20) {
      ++s.ok;
      s.peers += (r.body.size() - 20) / 6;
    } else if (r.answered) {
      ++s.errors[kErrFailure];  // an error answer, or a connect's where an announce's was due
    }
    co_return;
  }
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, t.host);
  req.set(http::field::user_agent, "libtorrent/2.0.8.0");
  req.set(http::field::accept_encoding, "gzip");
  req.set(http::field::connection, "close");
  beast::tcp_stream stream(g.ioc());
  Reply r;
  if (auto err = co_await Connect(stream, a.address, t.ep, timeout)) {
    r.err = *err;
  } else {
    r = co_await Exchange(stream, req, timeout);
  }
  beast::error_code ec;
  stream.socket().close(ec);
  Record(s, r, since);
  if (r.answered && r.status == 200) {
    if (r.body.find("failure reason") != std::string::npos) {
      ++s.errors[kErrFailure];
    } else {
      ++s.ok;
      s.peers += CompactPeers(r.body);
    }
  }
}

// After an exchange on a keep-alive connection: one the server closed (or that failed) is closed
// here, and the next request connects again.
void DropIfClosed(const Reply& r, beast::tcp_stream& stream, bool& open) {
  if (r.reusable) return;
  beast::error_code ec;
  stream.socket().close(ec);
  open = false;
}

// A seeder's periodic announce query of chunk c by agent a, as libtorrent 2.0 sends it (without
// the announce key).
std::string SeederQuery(const Agent& a, const Chunk& c) {
  return "info_hash=" + c.ih_escaped + "&peer_id=" + a.peer_id_esc +
         "&port=6881&uploaded=0&downloaded=" + std::to_string(c.length) + "&left=0&corrupt=0&key=" +
         a.key + "&numwant=200&compact=1&no_peer_id=1&supportcrypto=1&redundant=0";
}

// Announces on one keep-alive connection: every chunk torrent of agent a, in order.
awaitable<void> AnnounceKeepAlive(Gen& g, const Target& t, const Agent& a,
                                  const std::vector<Chunk>& chunks, std::atomic<bool>& over,
                                  milliseconds timeout) {
  auto stream = std::make_unique<beast::tcp_stream>(g.ioc());
  bool open = false;
  for (const Chunk& c : chunks) {
    if (over || g_stop) break;
    auto since = Clock::now();
    Reply r;
    if (!open) {
      stream = std::make_unique<beast::tcp_stream>(g.ioc());
      if (auto err = co_await Connect(*stream, a.address, t.ep, timeout)) {
        r.err = *err;
        Record(g.stats().k[kAnnPeriodic], r, since);
        continue;
      }
      open = true;
    }
    std::string target = t.announce_base + SeederQuery(a, c);
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, t.host);
    req.set(http::field::user_agent, "libtorrent/2.0.8.0");
    r = co_await Exchange(*stream, req, timeout);
    KindStats& s = g.stats().k[kAnnPeriodic];
    Record(s, r, since);
    if (r.answered && r.status == 200 && r.body.find("failure reason") == std::string::npos) {
      ++s.ok;
      s.peers += CompactPeers(r.body);
    } else if (r.answered && r.status == 200) {
      ++s.errors[kErrFailure];
    }
    DropIfClosed(r, *stream, open);
  }
  beast::error_code ec;
  stream->socket().close(ec);
}

// Announces in batches (POST /v1/announces, as an agent's relay sends them with
// --tracker-announce batch) on one keep-alive connection: every chunk torrent of agent a, `batch`
// at a time. Each announce's latency is its batch's.
awaitable<void> AnnounceBatches(Gen& g, const Target& t, const Agent& a,
                                const std::vector<Chunk>& chunks, size_t batch,
                                std::atomic<bool>& over, milliseconds timeout) {
  auto stream = std::make_unique<beast::tcp_stream>(g.ioc());
  bool open = false;
  for (size_t from = 0; from < chunks.size() && !over && !g_stop; from += batch) {
    const size_t n = std::min(batch, chunks.size() - from);
    auto since = Clock::now();
    Reply r;
    KindStats& s = g.stats().k[kAnnPeriodic];
    if (!open) {
      stream = std::make_unique<beast::tcp_stream>(g.ioc());
      if (auto err = co_await Connect(*stream, a.address, t.ep, timeout)) {
        r.err = *err;
        for (size_t i = 0; i < n; ++i) Record(s, r, since);
        continue;
      }
      open = true;
    }
    std::string body;
    body.reserve(n * 260);
    for (size_t i = from; i < from + n; ++i) {
      body += SeederQuery(a, chunks[i]);
      body += '\n';
    }
    http::request<http::string_body> req{http::verb::post, "/v1/announces", 11};
    req.set(http::field::host, t.host);
    req.set(http::field::authorization, t.bearer);
    req.set(http::field::content_type, "text/plain");
    req.body() = std::move(body);
    req.prepare_payload();
    r = co_await Exchange(*stream, req, timeout);
    for (size_t i = 0; i < n; ++i) Record(s, r, since);
    if (r.answered && r.status == 200) {
      size_t lines = 0;
      for (size_t at = 0; at < r.body.size();) {
        size_t nl = r.body.find('\n', at);
        if (nl == std::string::npos) break;
        auto reply = Base64Decode(std::string_view(r.body).substr(at, nl - at));
        if (reply && reply->find("failure reason") == std::string::npos) {
          ++s.ok;
          s.peers += CompactPeers(*reply);
        } else {
          ++s.errors[kErrFailure];
        }
        ++lines;
        at = nl + 1;
      }
      if (lines < n) s.errors[kErrFailure] += n - lines;
    }
    DropIfClosed(r, *stream, open);
  }
  beast::error_code ec;
  stream->socket().close(ec);
}

// A blob API call as the agent's HTTP client makes it: a pooled keep-alive connection (at most 8
// idle ones kept), a new one when none is idle.
awaitable<Reply> BlobCall(Gen& g, const Target& t, Agent& a, Kind kind, http::verb method,
                          std::string target, std::string body, milliseconds timeout) {
  auto since = Clock::now();
  Reply r;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<beast::tcp_stream> stream;
    bool reused = false;
    // The agent's client closes a connection idle for more than 15 s instead of reusing it.
    while (!a.pool.empty() && Clock::now() - a.pool.front().second > std::chrono::seconds(15)) {
      a.pool.erase(a.pool.begin());
    }
    if (!a.pool.empty()) {
      stream = std::move(a.pool.back().first);
      a.pool.pop_back();
      reused = true;
    } else {
      stream = std::make_unique<beast::tcp_stream>(g.ioc());
      if (auto err = co_await Connect(*stream, a.address, t.ep, milliseconds(2000))) {
        r = Reply{};
        r.err = *err;
        break;
      }
    }
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, t.host);
    req.set(http::field::authorization, t.bearer);
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    r = co_await Exchange(*stream, req, timeout);
    if (r.answered) {
      if (r.reusable && a.pool.size() < 8)
        a.pool.emplace_back(std::move(stream), Clock::now());
      break;
    }
    if (!reused) break;  // a stale pooled connection gets one retry on a fresh one
  }
  Record(g.stats().k[kind], r, since);
  if (r.answered && r.status == 200) ++g.stats().k[kind].ok;
  co_return r;
}

awaitable<void> Sleep(Gen& g, Clock::duration d) {
  asio::steady_timer timer(g.ioc());
  timer.expires_after(d);
  beast::error_code ec;
  co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
}

awaitable<void> SleepUntil(Gen& g, Clock::time_point when) {
  asio::steady_timer timer(g.ioc());
  timer.expires_at(when);
  beast::error_code ec;
  co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
}

// ---- Processes
// ------------------------------------------------------------------------------------

void PinAllThreads(pid_t pid, const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    pid_t tid = std::stoi(e.path().filename().string());
    if (sched_setaffinity(tid, sizeof(set), &set) != 0) {
      std::fprintf(stderr, "warning: cannot pin thread %d: %s\n", tid, std::strerror(errno));
    }
  }
}

std::string LoadAvg() {
  std::string s = ReadFile("/proc/loadavg");
  std::istringstream in(s);
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// ---- Phase bookkeeping
// ----------------------------------------------------------------------------

struct PhaseResult {
  std::string server, phase;
  double offered_rate = 0;  // b: scheduled announces/s; 0 otherwise
  double seconds = 0;
  Stats stats;
  double server_cpu_s = 0, gen_cpu_s = 0, machine_busy = 0;  // busy: fraction of all cores
  uint64_t server_rss = 0, server_hwm = 0;
  std::string load_before, load_after;
  double cpu_pressure_s = 0;
  double peers_held = -1;  // shoal_tracker_peers after the phase (shoal only)
  uint64_t fd_waits = 0;   // sockets that waited for a descriptor in the generator
  uint64_t conntrack_before = 0, conntrack_after = 0;
  std::string note;
};

class PhaseMeter {
 public:
  explicit PhaseMeter(pid_t server) : server_(server) {
    load_ = LoadAvg();
    cpu_ = ProcessCpuSeconds(server_);
    gen_ = ProcessCpuSeconds(getpid());
    ticks_ = ReadSystemTicks();
    psi_ = CpuPressureSeconds();
    conntrack_ = ConntrackCount();
    start_ = Clock::now();
  }
  void Finish(PhaseResult& r) {
    r.seconds = Seconds(Clock::now() - start_);
    r.server_cpu_s = ProcessCpuSeconds(server_) - cpu_;
    r.gen_cpu_s = ProcessCpuSeconds(getpid()) - gen_;
    SystemTicks t = ReadSystemTicks();
    r.machine_busy = t.total > ticks_.total ? static_cast<double>(t.busy - ticks_.busy) /
                                                  static_cast<double>(t.total - ticks_.total)
                                            : 0;
    r.server_rss = StatusBytes(server_, "VmRSS");
    r.server_hwm = StatusBytes(server_, "VmHWM");
    r.load_before = load_;
    r.load_after = LoadAvg();
    r.cpu_pressure_s = CpuPressureSeconds() - psi_;
    r.conntrack_before = conntrack_;
    r.conntrack_after = ConntrackCount();
  }

 private:
  pid_t server_;
  std::string load_;
  double cpu_ = 0, gen_ = 0, psi_ = 0;
  uint64_t conntrack_ = 0;
  SystemTicks ticks_;
  Clock::time_point start_;
};

Stats Collect(std::vector<std::unique_ptr<Gen>>& gens) {
  Stats all;
  for (auto& g : gens) all.Merge(g->TakeStats());
  return all;
}

uint64_t AnnouncesOk(const Stats& s) {
  return s.k[kAnnStarted].ok + s.k[kAnnCompleted].ok + s.k[kAnnPeriodic].ok;
}

// A permutation of [0, n): k -> (k * stride + offset) mod n with gcd(stride, n) = 1.
struct Shuffle {
  uint64_t n = 1, stride = 1, offset = 0;
  Shuffle(uint64_t n_, uint64_t seed) : n(std::max<uint64_t>(1, n_)) {
    std::mt19937_64 rng(seed);
    stride = (rng() % n) | 1;
    while (std::gcd(stride, n) != 1) stride = (stride + 2) % n;
    if (stride == 0) stride = 1;
    offset = rng() % n;
  }
  uint64_t operator()(uint64_t k) const {
    return (k % n * stride + offset) % n;  // n is at most ~10^8: no overflow
  }
};

// ---- The benchmark ------------------------------------------------------------------------------

class Bench {
 public:
  explicit Bench(Options o) : o_(std::move(o)) {}
  int Run();

 private:
  void StartShoal();
  void StartOpentracker(const std::string& whitelist);
  Status BuildImage();
  // mode 0: a connection per announce; 1: keep-alive; 2: batches of o_.batch.
  void PhaseClosed(const Target& t, pid_t pid, int mode);
  void PhaseSteady(const Target& t, pid_t pid, double multiplier);
  void PhaseCold(const Target& t, pid_t pid);
  awaitable<void> ColdAgent(Gen& g, const Target& t, Agent& a, Clock::time_point start,
                            Clock::time_point deadline);
  awaitable<void> ColdBlob(Gen& g, const Target& t, Agent& a, uint32_t b,
                           Clock::time_point deadline);
  void Report();
  void PrintPhase(const PhaseResult& r);
  json PhaseJson(PhaseResult& r);
  double SteadyRate() const {
    return static_cast<double>(o_.agents) * static_cast<double>(image_.chunks.size()) / 315.0;
  }
  Gen& GenOf(const Agent& a) { return *gens_[a.id % gens_.size()]; }
  void AfterPhase(const Target& t, PhaseResult& r) {
    r.fd_waits = g_fd_waits.exchange(0);
    if (t.name.rfind("shoal", 0) != 0) return;
    if (auto m = HttpGet("http://" + t.host + "/metrics"); m && m.value().status == 200) {
      r.peers_held = MetricSum(m.value().body, "shoal_tracker_peers");
    }
  }

  Options o_;
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<Process> shoal_, opentracker_;
  Target shoal_t_, ot_t_;
  Image image_;
  std::vector<Agent> agents_;
  std::vector<std::unique_ptr<Gen>> gens_;
  std::vector<PhaseResult> results_;
  std::string shoal_metrics_;
  std::vector<int> server_cpus_, gen_cpus_;
  std::string rlimit_note_;
};

void Bench::StartShoal() {
  std::string port_file = dir_->Sub("shoal.port");
  std::vector<std::string> argv = {o_.tracker_bin,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--port-file",
                                   port_file,
                                   "--log-format",
                                   "json",
                                   "--log-level",
                                   "info",
                                   "--agent-tokens-file",
                                   Tokens().agent_file,
                                   "--operator-tokens-file",
                                   Tokens().operator_file,
                                   "--peer-ca-cert",
                                   Tokens().peer_ca_cert};
  argv.insert(argv.end(), o_.tracker_args.begin(), o_.tracker_args.end());
  auto p = Process::Start(argv, dir_->Sub("shoal-tracker.log"));
  if (!p) throw std::runtime_error(p.error().ToString());
  shoal_ = std::move(p.value());
  bool up = WaitUntil([&] { return !shoal_->Running() || !ReadFile(port_file).empty(); },
                      std::chrono::seconds(20));
  if (!up || !shoal_->Running()) {
    throw std::runtime_error("shoal-tracker did not start: " + shoal_->LogTail());
  }
  int port = std::stoi(ReadFile(port_file));
  if (!WaitForHttp("http://127.0.0.1:" + std::to_string(port) + "/healthz",
                   std::chrono::seconds(20))) {
    throw std::runtime_error("shoal-tracker does not answer: " + shoal_->LogTail());
  }
  if (o_.pin && !server_cpus_.empty()) PinAllThreads(shoal_->pid(), server_cpus_);
  shoal_t_.name = "shoal";
  shoal_t_.ep = tcp::endpoint(asio::ip::make_address_v4("127.0.0.1"), static_cast<uint16_t>(port));
  shoal_t_.host = "127.0.0.1:" + std::to_string(port);
  shoal_t_.announce_base = "/announce?auth=" + auth::AnnounceKey(Tokens().agent) + "&";
  shoal_t_.bearer = "Bearer " + Tokens().agent;
  if (o_.transport == "udp") {
    shoal_t_.name = "shoal udp";
    shoal_t_.udp = true;
    shoal_t_.udp_ep = udp::endpoint(asio::ip::make_address_v4("127.0.0.1"), static_cast<uint16_t>(port));
    shoal_t_.url_data = "/announce?auth=" + auth::AnnounceKey(Tokens().agent);
    shoal_t_.udp_slot = 0;
  }
}

void Bench::StartOpentracker(const std::string& whitelist) {
  // Debian builds opentracker in whitelist mode (README.Debian): list every chunk torrent.
  std::string root = dir_->Sub("opentracker");
  fs::create_directories(root);
  fs::permissions(root, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                            fs::perms::others_read | fs::perms::others_exec);
  WriteFile(root + "/whitelist.txt", whitelist);
  uint16_t port = FreePort();
  const uint16_t udp_port = o_.transport == "udp" ? FreePort() : 0;
  WriteFile(root + "/opentracker.conf", "listen.tcp 127.0.0.1:" + std::to_string(port) +
                                            (udp_port != 0 ? "\nlisten.udp 127.0.0.1:" +
                                                                 std::to_string(udp_port)
                                                           : std::string()) +
                                            // Relative: opentracker reads it after its chroot.
                                            "\naccess.whitelist whitelist.txt\ntracker.rootdir " +
                                            root + "\n");
  auto p = Process::Start({o_.opentracker_bin, "-f", root + "/opentracker.conf"},
                          dir_->Sub("opentracker.log"));
  if (!p) throw std::runtime_error(p.error().ToString());
  opentracker_ = std::move(p.value());
  if (!WaitForHttp("http://127.0.0.1:" + std::to_string(port) + "/stats",
                   std::chrono::seconds(20)) ||
      !opentracker_->Running()) {
    throw std::runtime_error("opentracker did not start: " + opentracker_->LogTail());
  }
  if (o_.pin && !server_cpus_.empty()) PinAllThreads(opentracker_->pid(), server_cpus_);
  // It loads the whitelist in a thread of its own: wait until an announce of ours is accepted.
  const Chunk& probe = image_.chunks.front();
  std::string url = "http://127.0.0.1:" + std::to_string(port) +
                    "/announce?info_hash=" + probe.ih_escaped +
                    "&peer_id=-LT2080-probeprobe00&port=1&left=0&compact=1";
  bool ok = WaitUntil(
      [&] {
        auto r = HttpGet(url);
        return r && r.value().status == 200 &&
               r.value().body.find("failure reason") == std::string::npos;
      },
      std::chrono::seconds(20), milliseconds(200));
  if (!ok)
    throw std::runtime_error("opentracker refuses our chunk torrents (whitelist not loaded)");
  ot_t_.name = "opentracker";
  ot_t_.ep = tcp::endpoint(asio::ip::make_address_v4("127.0.0.1"), port);
  ot_t_.host = "127.0.0.1:" + std::to_string(port);
  ot_t_.announce_base = "/announce?";
  if (udp_port != 0) {
    ot_t_.name = "opentracker udp";
    ot_t_.udp = true;
    ot_t_.udp_ep = udp::endpoint(asio::ip::make_address_v4("127.0.0.1"), udp_port);
    ot_t_.udp_slot = 1;
  }
}

// The image's chunk tables, from the tracker (as an agent creates them), and each chunk's torrent.
Status Bench::BuildImage() {
  std::vector<uint64_t> sizes = LayerSizes(o_.image_gb);
  std::string url = "http://" + shoal_t_.host;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Blob b;
    b.digest = Sha256::Of("shoal-bench-tracker layer " + std::to_string(i));
    b.size = sizes[i];
    json req{{"agent", "bench-setup"},
             {"size", b.size},
             {"registry", "registry.example"},
             {"repository", "bench/ml-image"}};
    auto r = HttpRequest("POST", url + "/v1/blobs/" + b.digest.str(), AgentAuth(), req.dump());
    if (!r) return r.error();
    if (r.value().status != 200) {
      return MakeError(ErrorCode::kProtocol, "chunk table: tracker answered " +
                                                 std::to_string(r.value().status) + ": " +
                                                 r.value().body);
    }
    json j = json::parse(r.value().body);
    b.layout.blob_size = j.at("size").get<uint64_t>();
    b.layout.chunk_size = j.at("chunk_size").get<uint64_t>();
    b.layout.piece_size = j.at("piece_size").get<uint32_t>();
    b.layout.first_chunk_size = j.value("first_chunk_size", uint64_t{0});
    if (auto st = b.layout.Validate(); !st) return st.error();
    for (uint32_t k = 0; k < b.layout.chunk_count(); ++k) {
      Chunk c;
      c.blob = static_cast<uint32_t>(image_.blobs.size());
      c.k = k;
      c.length = b.layout.chunk_length(k);
      // Fake piece hashes (the tracker never sees content): distinct per chunk.
      std::vector<swarm::Sha1> hashes(b.layout.piece_count(k));
      for (size_t p = 0; p < hashes.size(); ++p) {
        Digest d = Sha256::Of(b.digest.hex() + "/" + std::to_string(k) + "/" + std::to_string(p));
        std::string raw = d.hex();
        for (size_t x = 0; x < 20; ++x) {
          hashes[p][x] = static_cast<uint8_t>(std::stoi(raw.substr(2 * x, 2), nullptr, 16));
        }
      }
      auto t = swarm::BuildChunkTorrent(b.digest.hex() + "." + std::to_string(k), c.length,
                                        b.layout.piece_size_of(k), std::move(hashes),
                                        Tokens().peer_ca_pem);
      if (!t) return t.error();
      c.metainfo = t.value().metainfo;
      c.ih_bytes.assign(reinterpret_cast<const char*>(t.value().info_hash.data()), 20);
      c.ih_escaped = Escape(c.ih_bytes);
      b.chunks.push_back(static_cast<uint32_t>(image_.chunks.size()));
      image_.chunks.push_back(std::move(c));
    }
    image_.bytes += b.size;
    image_.blobs.push_back(std::move(b));
  }
  return Ok();
}

// ---- Phase c: closed loop
// ------------------------------------------------------------------------

void Bench::PhaseClosed(const Target& t, pid_t pid, int mode) {
  const bool keepalive = mode == 1;
  const bool batches = mode == 2;
  const uint64_t pairs = static_cast<uint64_t>(o_.agents) * image_.chunks.size();
  const double seconds = keepalive ? o_.keepalive_seconds
                         : batches ? o_.batch_seconds
                                   : o_.closed_seconds;
  const std::string how = keepalive ? " (keep-alive)"
                          : batches ? fmt::format(" (batches of {})", o_.batch)
                                    : std::string();
  std::fprintf(stderr, "[%s] phase c%s: closed loop, %d in flight, %llu announces at most, %.0f s\n",
               t.name.c_str(), how.c_str(), o_.concurrency, static_cast<unsigned long long>(pairs),
               seconds);
  PhaseResult r;
  r.server = t.name;
  r.phase = keepalive ? "c keep-alive"
            : batches ? fmt::format("c batches of {}", o_.batch)
                      : "c closed loop";
  PhaseMeter meter(pid);
  std::atomic<uint64_t> next{0};
  std::atomic<bool> over{false};
  std::atomic<int> running{0};
  Shuffle shuffle(pairs, o_.seed + 3);
  const milliseconds timeout(o_.timeout_ms);
  const uint64_t chunks = image_.chunks.size();
  for (int w = 0; w < o_.concurrency; ++w) {
    running++;
    asio::co_spawn(
        gens_[static_cast<size_t>(w) % gens_.size()]->ioc(),
        [&, w]() -> awaitable<void> {
          Gen& g = *gens_[static_cast<size_t>(w) % gens_.size()];
          if (keepalive || batches) {
            // Worker w takes agents w, w + C, ...: each on its own connection for all its torrents.
            for (uint64_t ai = static_cast<uint64_t>(w); ai < agents_.size() && !over && !g_stop;
                 ai += static_cast<uint64_t>(o_.concurrency)) {
              if (batches) {
                co_await AnnounceBatches(g, t, agents_[ai], image_.chunks,
                                         static_cast<size_t>(o_.batch), over, timeout);
              } else {
                co_await AnnounceKeepAlive(g, t, agents_[ai], image_.chunks, over, timeout);
              }
            }
          } else {
            for (;;) {
              uint64_t k = next++;
              if (k >= pairs || over || g_stop) break;
              uint64_t p = shuffle(k);
              co_await Announce(g, t, agents_[p / chunks], image_.chunks[p % chunks], Event::kNone,
                                0, Clock::now(), timeout);
            }
          }
          running--;
        },
        asio::detached);
  }
  auto start = Clock::now();
  auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(seconds));
  uint64_t last = 0;
  auto last_t = start;
  while (running > 0) {
    std::this_thread::sleep_for(milliseconds(200));
    auto now = Clock::now();
    if (now >= deadline || g_stop) over = true;
    if (now - last_t >= std::chrono::seconds(5)) {
      uint64_t n = 0;
      for (auto& g : gens_) {
        g->Run([&] { n += g->stats().k[kAnnPeriodic].latency_us.size(); });
      }
      std::fprintf(stderr, "  %5.1f s: %llu answered, %.0f/s\n", Seconds(now - start),
                   static_cast<unsigned long long>(n),
                   static_cast<double>(n - last) / Seconds(now - last_t));
      last = n;
      last_t = now;
    }
  }
  meter.Finish(r);
  r.stats = Collect(gens_);
  AfterPhase(t, r);
  results_.push_back(std::move(r));
  PrintPhase(results_.back());
}

// ---- Phase b: open loop at the steady-state rate
// -------------------------------------------------

void Bench::PhaseSteady(const Target& t, pid_t pid, double multiplier) {
  const uint64_t pairs = static_cast<uint64_t>(o_.agents) * image_.chunks.size();
  const double rate = SteadyRate() * multiplier;
  const uint64_t count = std::min<uint64_t>(pairs, static_cast<uint64_t>(rate * o_.steady_seconds));
  std::fprintf(stderr,
               "[%s] phase b: open loop at %.0f announces/s (%.0fx the 2,500-node load), "
               "%llu announces, %.0f s\n",
               t.name.c_str(), rate, multiplier, static_cast<unsigned long long>(count),
               static_cast<double>(count) / rate);
  PhaseResult r;
  r.server = t.name;
  r.phase = fmt::format("b steady {:g}x", multiplier);
  r.offered_rate = rate;
  PhaseMeter meter(pid);
  Shuffle shuffle(pairs, o_.seed + 7 + static_cast<uint64_t>(multiplier * 100));
  const uint64_t chunks = image_.chunks.size();
  const milliseconds timeout(o_.timeout_ms);
  auto start = Clock::now() + milliseconds(100);
  std::atomic<int> running{0};
  const size_t cap = std::max<size_t>(1, o_.max_inflight / gens_.size());
  for (size_t gi = 0; gi < gens_.size(); ++gi) {
    running++;
    asio::co_spawn(
        gens_[gi]->ioc(),
        [&, gi]() -> awaitable<void> {
          Gen& g = *gens_[gi];
          for (uint64_t k = gi; k < count && !g_stop; k += gens_.size()) {
            auto when = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(static_cast<double>(k) / rate));
            if (Clock::now() < when) co_await SleepUntil(g, when);
            if (g.inflight >= cap) {
              ++g.stats().k[kAnnPeriodic].errors[kErrDropped];
              continue;
            }
            uint64_t p = shuffle(k);
            ++g.inflight;
            asio::co_spawn(
                g.ioc(),
                [&g, &t, &a = agents_[p / chunks], &c = image_.chunks[p % chunks], when,
                 timeout]() -> awaitable<void> {
                  co_await Announce(g, t, a, c, Event::kNone, 0, when, timeout);
                  --g.inflight;
                },
                asio::detached);
          }
          // Wait for the stragglers (bounded by the request timeout).
          while (g.inflight > 0) co_await Sleep(g, milliseconds(10));
          running--;
        },
        asio::detached);
  }
  auto last_t = Clock::now();
  while (running > 0) {
    std::this_thread::sleep_for(milliseconds(200));
    if (Clock::now() - last_t >= std::chrono::seconds(5)) {
      last_t = Clock::now();
      size_t inflight = 0, n = 0;
      for (auto& g : gens_) {
        g->Run([&] {
          inflight += g->inflight;
          n += g->stats().k[kAnnPeriodic].latency_us.size();
        });
      }
      std::fprintf(stderr, "  %5.1f s: %zu answered, %zu in flight\n",
                   Seconds(Clock::now() - start), n, inflight);
    }
  }
  meter.Finish(r);
  r.stats = Collect(gens_);
  AfterPhase(t, r);
  results_.push_back(std::move(r));
  PrintPhase(results_.back());
}

// ---- Phase a: the cold cluster-wide pull
// ---------------------------------------------------------

constexpr milliseconds kLeaseWait{5000};      // the agent's --lease-wait-ms
constexpr milliseconds kTrackerGrace{10000};  // the agent's --tracker-grace-ms
constexpr milliseconds kPollTimeout{20000};   // the agent's tracker client idle timeout

std::string SourceBody(const Agent& a, const Blob& b) {
  return json{{"agent", a.name},
              {"size", b.size},
              {"registry", "registry.example"},
              {"repository", "bench/ml-image"}}
      .dump();
}

struct ColdFetch {
  std::vector<uint8_t> filled;       // per chunk of the blob
  std::vector<uint8_t> in_upstream;  // our upstream worker fetches it
  std::vector<uint8_t> ready;        // the tracker said ready (the watcher's answers)
  bool watch_failed = false;         // the watcher got no usable answer for the grace
  uint32_t next = 0;                 // the window's next chunk
  uint32_t left = 0;                 // chunks not filled
  Clock::time_point tracker_ok;
};

Clock::duration Transfer(uint64_t bytes, double gbit) {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) * 8 / (gbit * 1e9)));
}

awaitable<void> Bench::ColdBlob(Gen& g, const Target& t, Agent& a, uint32_t bi,
                                Clock::time_point deadline) {
  const Blob& blob = image_.blobs[bi];
  const std::string body = SourceBody(a, blob);
  const std::string base = "/v1/blobs/" + blob.digest.str();
  Stats& st = g.stats();
  // The chunk table, retried for the grace like the agent; then the blob goes straight upstream.
  auto table_deadline = Clock::now() + kTrackerGrace;
  for (;;) {
    Reply r = co_await BlobCall(g, t, a, kTable, http::verb::post, base, body, milliseconds(5000));
    if (r.answered && r.status == 200) break;
    if (!r.answered && r.err == kErrLocal) table_deadline += milliseconds(500);  // ours, not its
    if (Clock::now() >= table_deadline || Clock::now() >= deadline || g_stop) {
      ++st.blob_fallbacks;
      co_return;
    }
    co_await Sleep(g, milliseconds(500));
  }
  auto f = std::make_shared<ColdFetch>();
  const uint32_t n = static_cast<uint32_t>(blob.chunks.size());
  f->filled.assign(n, 0);
  f->in_upstream.assign(n, 0);
  f->left = n;
  f->tracker_ok = Clock::now();
  auto over = [&] { return f->left == 0 || Clock::now() >= deadline || g_stop; };
  auto fill = [f](uint32_t k) {
    if (!f->filled[k]) {
      f->filled[k] = 1;
      --f->left;
    }
  };
  int running = 0;
  // The upstream worker: asks the tracker for work on the blob, fetches what it is granted.
  running++;
  asio::co_spawn(
      g.ioc(),
      [&, f]() -> awaitable<void> {
        while (!over()) {
          auto started = Clock::now();
          Reply r = co_await BlobCall(g, t, a, kWork, http::verb::post,
                                      base + "/work?wait_ms=" + std::to_string(kLeaseWait.count()),
                                      body, kPollTimeout);
          if (over()) break;
          if (!r.answered || r.status != 200) {
            co_await Sleep(g, milliseconds(500));
            continue;
          }
          json j = json::parse(r.body, nullptr, false);
          std::string state = j.is_object() ? j.value("state", "") : "";
          if (state == "done") {
            ++st.work_done;
            // The agent stays until its own chunks are filled (a bad report wakes it).
            auto until = Clock::now() + kLeaseWait;
            while (!over() && Clock::now() < until) co_await Sleep(g, milliseconds(100));
            continue;
          }
          if (state != "granted") {
            ++st.work_wait;
            if (Clock::now() - started < milliseconds(200)) {
              co_await Sleep(g, std::clamp(milliseconds(j.value("retry_after_ms", 1000)),
                                           milliseconds(100), milliseconds(2000)));
            }
            continue;
          }
          ++st.granted;
          const uint32_t k = j.value("chunk", 0u);
          const std::string lease_id = j.value("lease_id", "");
          const milliseconds ttl(j.value("ttl_ms", 15000));
          const Chunk& c = image_.chunks[blob.chunks[k]];
          f->in_upstream[k] = 1;
          // The upstream fetch: this lease's share of the NAT link; renewals every ttl/3.
          auto done_at =
              Clock::now() + Transfer(c.length, o_.upstream_gbit / std::max(1, o_.max_fetchers));
          auto period = std::max(milliseconds(200), ttl / 3);
          bool lost = false;
          while (Clock::now() + period < done_at && !over()) {
            co_await Sleep(g, period);
            json renew{{"agent", a.name}, {"lease_id", lease_id}, {"bytes", c.length / 2}};
            Reply rr = co_await BlobCall(g, t, a, kRenew, http::verb::post,
                                         base + "/chunks/" + std::to_string(k) + "/renew",
                                         renew.dump(), milliseconds(5000));
            if (rr.answered && rr.status == 409) {
              ++st.lost_leases;
              lost = true;
              break;
            }
          }
          if (!lost) co_await SleepUntil(g, done_at);
          if (Clock::now() >= deadline || g_stop) break;
          json pub = json::parse(body);
          pub["lease_id"] = lease_id;
          pub["metainfo"] = Base64Encode(c.metainfo);
          Reply pr = co_await BlobCall(g, t, a, kPublish, http::verb::put,
                                       base + "/chunks/" + std::to_string(k), pub.dump(),
                                       milliseconds(5000));
          (void)pr;
          f->in_upstream[k] = 0;
          if (!f->filled[k]) ++st.chunks_upstream;
          fill(k);
          // Now a seed of the chunk: libtorrent announces started with left=0.
          asio::co_spawn(
              g.ioc(),
              Announce(g, t, a, c, Event::kStarted, 0, Clock::now(), milliseconds(o_.timeout_ms)),
              asio::detached);
        }
        running--;
      },
      asio::detached);
  // The ready watcher: one long-poll per blob for the lowest chunks not held or known ready.
  f->ready.assign(n, 0);
  running++;
  asio::co_spawn(
      g.ioc(),
      [&, f]() -> awaitable<void> {
        while (!over()) {
          json wanted = json::array();
          for (uint32_t k = 0; k < n && wanted.size() < 16; ++k) {
            if (!f->filled[k] && !f->in_upstream[k] && !f->ready[k]) wanted.push_back(k);
          }
          if (wanted.empty()) {
            co_await Sleep(g, milliseconds(20));
            continue;
          }
          json req = json::parse(body);
          req["chunks"] = std::move(wanted);
          auto started = Clock::now();
          Reply r = co_await BlobCall(g, t, a, kReady, http::verb::post,
                                      base + "/ready?wait_ms=" + std::to_string(kLeaseWait.count()),
                                      req.dump(), kPollTimeout);
          if (over()) break;
          if (!r.answered && r.err == kErrLocal) {
            // Out of file descriptors here, not the tracker's doing: no step to a fallback.
            co_await Sleep(g, milliseconds(100));
            continue;
          }
          if (!r.answered || r.status != 200) {
            // No usable answer for the grace: the workers fetch straight from upstream.
            if (Clock::now() - f->tracker_ok >= kTrackerGrace) f->watch_failed = true;
            co_await Sleep(g, milliseconds(500));
            continue;
          }
          f->tracker_ok = Clock::now();
          f->watch_failed = false;
          json j = json::parse(r.body, nullptr, false);
          std::string state = j.is_object() ? j.value("state", "") : "";
          if (state == "ready" && j.contains("chunks") && j["chunks"].is_array()) {
            for (const json& c : j["chunks"]) {
              uint32_t k = c.value("chunk", n);
              if (k < n) f->ready[k] = 1;
              ++st.lease_ready;
            }
            continue;
          }
          ++st.lease_wait;
          if (Clock::now() - started < milliseconds(200)) {
            co_await Sleep(
                g, std::clamp(milliseconds(j.is_object() ? j.value("retry_after_ms", 1000) : 1000),
                              milliseconds(100), milliseconds(2000)));
          }
        }
        running--;
      },
      asio::detached);
  // The window workers: wait for each chunk to be ready, then take it from peers.
  const int workers = std::max(1, std::min<int>(o_.window, static_cast<int>(n)));
  for (int w = 0; w < workers; ++w) {
    running++;
    asio::co_spawn(
        g.ioc(),
        [&, f]() -> awaitable<void> {
          while (!over() && f->next < n) {
            const uint32_t k = f->next++;
            const Chunk& c = image_.chunks[blob.chunks[k]];
            while (!over() && !f->filled[k]) {
              if (f->in_upstream[k] || (!f->ready[k] && !f->watch_failed)) {
                co_await Sleep(g, milliseconds(20));
                continue;
              }
              if (!f->ready[k]) {
                // The agent fetches this chunk straight from upstream, outside the cluster's
                // lease quota.
                ++st.chunk_fallbacks;
                co_await Sleep(g, Transfer(c.length, o_.upstream_gbit / o_.max_fetchers));
                fill(k);
                break;
              }
              co_await Announce(g, t, a, c, Event::kStarted, c.length, Clock::now(),
                                milliseconds(o_.timeout_ms));
              // The node link as a FIFO: this chunk after what the link carries already.
              auto now = Clock::now();
              a.link_free = std::max(a.link_free, now) + Transfer(c.length, o_.node_gbit);
              co_await SleepUntil(g, a.link_free);
              if (over()) break;
              // libtorrent sends it on its own; the worker goes on with the next chunk.
              asio::co_spawn(g.ioc(),
                             Announce(g, t, a, c, Event::kCompleted, 0, Clock::now(),
                                      milliseconds(o_.timeout_ms)),
                             asio::detached);
              if (!f->filled[k]) ++st.chunks_from_peers;
              fill(k);
              break;
            }
          }
          running--;
        },
        asio::detached);
  }
  while (running > 0) co_await Sleep(g, milliseconds(50));
}

awaitable<void> Bench::ColdAgent(Gen& g, const Target& t, Agent& a, Clock::time_point start,
                                 Clock::time_point deadline) {
  co_await SleepUntil(g, start);
  const auto began = Clock::now();
  int running = 0;
  for (int s = 0; s < o_.parallel_blobs; ++s) {
    running++;
    asio::co_spawn(
        g.ioc(),
        [&]() -> awaitable<void> {
          // Largest layers first is what runtimes do not promise; take them in manifest order.
          while (a.next_blob < image_.blobs.size() && Clock::now() < deadline && !g_stop) {
            uint32_t b = a.next_blob++;
            co_await ColdBlob(g, t, a, b, deadline);
          }
          running--;
        },
        asio::detached);
  }
  while (running > 0) co_await Sleep(g, milliseconds(50));
  if (Clock::now() < deadline && !g_stop) {
    g.stats().agent_done_s.push_back(Seconds(Clock::now() - began));
  }
  a.pool.clear();
}

void Bench::PhaseCold(const Target& t, pid_t pid) {
  std::fprintf(stderr,
               "[%s] phase a: cold pull of %.1f GB (%zu layers, %zu chunk torrents) by %d agents, "
               "%.0f s at most\n",
               t.name.c_str(), static_cast<double>(image_.bytes) / 1e9, image_.blobs.size(),
               image_.chunks.size(), o_.agents, o_.cold_seconds);
  PhaseResult r;
  r.server = t.name;
  r.phase = "a cold pull";
  PhaseMeter meter(pid);
  auto start = Clock::now() + milliseconds(200);
  auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(o_.cold_seconds));
  std::atomic<int> running{0};
  std::mt19937_64 rng(o_.seed + 11);
  std::uniform_real_distribution<double> spread(0, o_.start_spread_s);
  for (Agent& a : agents_) {
    auto when = start + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(spread(rng)));
    running++;
    Gen* g = &GenOf(a);
    Agent* ap = &a;
    asio::co_spawn(
        g->ioc(),
        [this, g, ap, &t, &running, when, deadline]() -> awaitable<void> {
          co_await ColdAgent(*g, t, *ap, when, deadline);
          running--;
        },
        asio::detached);
  }
  auto last_t = Clock::now();
  while (running > 0) {
    std::this_thread::sleep_for(milliseconds(200));
    if (Clock::now() - last_t >= std::chrono::seconds(5)) {
      last_t = Clock::now();
      size_t done = 0, peers = 0, up = 0, fb = 0;
      for (auto& g : gens_) {
        g->Run([&] {
          done += g->stats().agent_done_s.size();
          peers += g->stats().chunks_from_peers;
          up += g->stats().chunks_upstream;
          fb += g->stats().chunk_fallbacks;
        });
      }
      std::fprintf(stderr,
                   "  %5.1f s: %zu agents done; chunks: %zu from peers, %zu upstream under lease, "
                   "%zu fallbacks\n",
                   Seconds(Clock::now() - start), done, peers, up, fb);
    }
  }
  meter.Finish(r);
  r.stats = Collect(gens_);
  AfterPhase(t, r);
  results_.push_back(std::move(r));
  PrintPhase(results_.back());
}

// ---- Reporting
// -----------------------------------------------------------------------------------

void Bench::PrintPhase(const PhaseResult& rc) {
  PhaseResult r = rc;  // percentiles reorder the samples
  std::printf(
      "\n== %s, phase %s: %.1f s; %s CPU %.1f s (%.2f cores), generator CPU %.1f s "
      "(%.2f cores), machine busy %.0f%%, load %s -> %s; %s RSS %.1f MiB (peak %.1f)\n",
      r.server.c_str(), r.phase.c_str(), r.seconds, r.server.c_str(), r.server_cpu_s,
      r.server_cpu_s / r.seconds, r.gen_cpu_s, r.gen_cpu_s / r.seconds, r.machine_busy * 100,
      r.load_before.c_str(), r.load_after.c_str(), r.server.c_str(),
      static_cast<double>(r.server_rss) / (1 << 20), static_cast<double>(r.server_hwm) / (1 << 20));
  std::printf(
      "   CPU pressure (some) %.1f s of %.1f s; conntrack entries %llu -> %llu; generator "
      "sockets that waited for a descriptor: %llu\n",
      r.cpu_pressure_s, r.seconds, static_cast<unsigned long long>(r.conntrack_before),
      static_cast<unsigned long long>(r.conntrack_after),
      static_cast<unsigned long long>(r.fd_waits));
  {
    std::vector<uint32_t> lag = r.stats.lag_us;
    std::printf(
        "   generator event-loop lag (50 ms probe): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
        Percentile(lag, 50), Percentile(lag, 99), Percentile(lag, 100));
  }
  if (r.peers_held >= 0) {
    std::printf("   peers held by the tracker afterwards: %.0f (%.0f bytes of RSS a peer)\n",
                r.peers_held,
                r.peers_held > 0 ? static_cast<double>(r.server_rss) / r.peers_held : 0.0);
  }
  if (r.offered_rate > 0) std::printf("   offered %.0f announces/s\n", r.offered_rate);
  std::printf("   %-27s %9s %9s %8s %8s %8s %8s  %s\n", "request", "ok", "per s", "p50 ms",
              "p99 ms", "max ms", "peers", "errors");
  for (int i = 0; i < kKinds; ++i) {
    KindStats& s = r.stats.k[i];
    uint64_t errs = Errors(s);
    if (s.ok == 0 && errs == 0) continue;
    std::string e;
    for (int x = 0; x < kErrs; ++x) {
      if (s.errors[x]) e += fmt::format("{} {}; ", kErrName[x], s.errors[x]);
    }
    for (auto [code, cnt] : s.statuses) e += fmt::format("[{}: {}] ", code, cnt);
    double avg_peers = s.ok ? static_cast<double>(s.peers) / static_cast<double>(s.ok) : 0;
    std::printf("   %-27s %9llu %9.0f %8.2f %8.2f %8.1f %8s  %s\n", kKindName[i],
                static_cast<unsigned long long>(s.ok), static_cast<double>(s.ok) / r.seconds,
                Percentile(s.latency_us, 50), Percentile(s.latency_us, 99),
                Percentile(s.latency_us, 100),
                i <= kAnnPeriodic ? fmt::format("{:.0f}", avg_peers).c_str() : "",
                e.empty() ? "none" : e.c_str());
  }
  if (r.phase.rfind("a", 0) == 0) {
    std::vector<uint32_t> done;
    for (double d : r.stats.agent_done_s) done.push_back(static_cast<uint32_t>(d * 1e6));
    std::printf(
        "   agents done %zu of %d (p50 %.1f s, p99 %.1f s, max %.1f s); chunks: %llu from peers, "
        "%llu upstream under lease, %llu fallbacks to upstream (chunks), %llu blobs without a "
        "table; work answers: %llu granted, %llu wait, %llu done; ready polls: %llu chunks ready, "
        "%llu empty; leases lost %llu\n",
        done.size(), o_.agents, Percentile(done, 50) / 1000, Percentile(done, 99) / 1000,
        Percentile(done, 100) / 1000, static_cast<unsigned long long>(r.stats.chunks_from_peers),
        static_cast<unsigned long long>(r.stats.chunks_upstream),
        static_cast<unsigned long long>(r.stats.chunk_fallbacks),
        static_cast<unsigned long long>(r.stats.blob_fallbacks),
        static_cast<unsigned long long>(r.stats.granted),
        static_cast<unsigned long long>(r.stats.work_wait),
        static_cast<unsigned long long>(r.stats.work_done),
        static_cast<unsigned long long>(r.stats.lease_ready),
        static_cast<unsigned long long>(r.stats.lease_wait),
        static_cast<unsigned long long>(r.stats.lost_leases));
  }
  std::fflush(stdout);
}

json Bench::PhaseJson(PhaseResult& r) {
  json j{{"server", r.server},
         {"phase", r.phase},
         {"seconds", r.seconds},
         {"offered_rate", r.offered_rate},
         {"server_cpu_s", r.server_cpu_s},
         {"generator_cpu_s", r.gen_cpu_s},
         {"machine_busy", r.machine_busy},
         {"server_rss", r.server_rss},
         {"server_peak_rss", r.server_hwm},
         {"load_before", r.load_before},
         {"load_after", r.load_after},
         {"cpu_pressure_s", r.cpu_pressure_s},
         {"conntrack_before", r.conntrack_before},
         {"conntrack_after", r.conntrack_after},
         {"peers_held", r.peers_held},
         {"fd_waits", r.fd_waits},
         {"generator_lag_p99_ms", Percentile(r.stats.lag_us, 99)}};
  for (int i = 0; i < kKinds; ++i) {
    KindStats& s = r.stats.k[i];
    if (s.ok == 0 && Errors(s) == 0) continue;
    json e = json::object();
    for (int x = 0; x < kErrs; ++x) {
      if (s.errors[x]) e[kErrName[x]] = s.errors[x];
    }
    j["requests"][kKindKey[i]] = {{"ok", s.ok},
                                  {"per_s", static_cast<double>(s.ok) / r.seconds},
                                  {"p50_ms", Percentile(s.latency_us, 50)},
                                  {"p99_ms", Percentile(s.latency_us, 99)},
                                  {"max_ms", Percentile(s.latency_us, 100)},
                                  {"errors", e}};
  }
  return j;
}

// The side-by-side table: one row per (phase, server).
void Bench::Report() {
  std::printf(
      "\n== shoal-bench-tracker: %d agents, %.1f GB image, %zu layers, %zu chunk torrents "
      "(%llu peers at steady state); 2,500-node load %.0f announces/s (interval 300 s + "
      "up to 10%% jitter); nproc %u%s\n",
      o_.agents, static_cast<double>(image_.bytes) / 1e9, image_.blobs.size(), image_.chunks.size(),
      static_cast<unsigned long long>(static_cast<uint64_t>(o_.agents) * image_.chunks.size()),
      SteadyRate(), std::thread::hardware_concurrency(),
      o_.pin ? "; trackers pinned to CPU 0, generator to the other CPUs" : "");
  if (!rlimit_note_.empty()) std::printf("   %s\n", rlimit_note_.c_str());
  std::printf("\n%-14s %-12s %9s %9s %8s %8s %8s %7s %9s %8s %6s  %s\n", "phase", "server",
              "offered/s", "ann/s", "p50 ms", "p99 ms", "max ms", "errors", "peak RSS", "srv cores",
              "gen c", "load");
  for (PhaseResult& rc : results_) {
    PhaseResult r = rc;
    KindStats all;
    for (int i : {kAnnStarted, kAnnCompleted, kAnnPeriodic}) {
      const KindStats& s = r.stats.k[i];
      all.ok += s.ok;
      for (int x = 0; x < kErrs; ++x) all.errors[x] += s.errors[x];
      all.latency_us.insert(all.latency_us.end(), s.latency_us.begin(), s.latency_us.end());
    }
    std::printf(
        "%-14s %-12s %9s %9.0f %8.2f %8.2f %8.1f %7llu %7.0f Mi %8.2f %6.2f  %s\n", r.phase.c_str(),
        r.server.c_str(), r.offered_rate > 0 ? fmt::format("{:.0f}", r.offered_rate).c_str() : "-",
        static_cast<double>(all.ok) / r.seconds, Percentile(all.latency_us, 50),
        Percentile(all.latency_us, 99), Percentile(all.latency_us, 100),
        static_cast<unsigned long long>(Errors(all)), static_cast<double>(r.server_hwm) / (1 << 20),
        r.server_cpu_s / r.seconds, r.gen_cpu_s / r.seconds, r.load_after.c_str());
  }
  if (!shoal_metrics_.empty()) {
    std::printf("\nshoal-tracker /metrics at the end (cross-check):\n");
    auto m = [&](const char* name, std::map<std::string, std::string> labels = {}) {
      return MetricSum(shoal_metrics_, name, labels);
    };
    uint64_t ann = 0;
    for (PhaseResult& r : results_) {
      if (r.server.rfind("shoal", 0) == 0) ann += AnnouncesOk(r.stats);
    }
    std::printf(
        "   announces_total %.0f (generator counted %llu answered without failure), "
        "announce_failures_total %.0f, peers %.0f, swarms %.0f, seeders %.0f, "
        "unregistered_peers_total %.0f\n",
        m("shoal_tracker_announces_total"), static_cast<unsigned long long>(ann),
        m("shoal_tracker_announce_failures_total"), m("shoal_tracker_peers"),
        m("shoal_tracker_swarms"), m("shoal_tracker_seeders"),
        m("shoal_tracker_unregistered_peers_total"));
    std::printf("   blob API: ");
    for (const char* route :
         {"create_blob", "get_blob", "work", "lease", "renew", "publish", "release"}) {
      std::printf("%s %.0f; ", route,
                  m("shoal_tracker_blob_api_requests_total", {{"route", route}}));
    }
    std::printf("\n   leases granted %.0f, expired %.0f, chunks published %.0f, lease waits %.0f\n",
                m("shoal_tracker_leases_granted_total"), m("shoal_tracker_leases_expired_total"),
                m("shoal_tracker_chunks_published_total"), m("shoal_tracker_lease_waits_total"));
  }
  if (!o_.json_out.empty()) {
    json j{{"agents", o_.agents},           {"image_bytes", image_.bytes},
           {"layers", image_.blobs.size()}, {"chunk_torrents", image_.chunks.size()},
           {"steady_rate", SteadyRate()},   {"nproc", std::thread::hardware_concurrency()},
           {"phases", json::array()}};
    for (PhaseResult& r : results_) j["phases"].push_back(PhaseJson(r));
    std::ofstream(o_.json_out) << j.dump(2) << "\n";
  }
  std::fflush(stdout);
}

int Bench::Run() {
  // File descriptors: phase a holds a connection per long-poll (tens of thousands).
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rlimit want{1'000'000, 1'000'000};
  if (setrlimit(RLIMIT_NOFILE, &want) != 0) {
    want.rlim_cur = rl.rlim_max;
    want.rlim_max = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &want);
    getrlimit(RLIMIT_NOFILE, &rl);
    rlimit_note_ = fmt::format("RLIMIT_NOFILE could only be raised to {} (not 1,000,000)",
                               static_cast<unsigned long long>(rl.rlim_cur));
  }
  getrlimit(RLIMIT_NOFILE, &rl);
  if (o_.max_inflight + 2000 > rl.rlim_cur) {
    o_.max_inflight = rl.rlim_cur > 4000 ? rl.rlim_cur - 2000 : rl.rlim_cur / 2;
  }
  unsigned ncpu = std::thread::hardware_concurrency();
  if (o_.pin && ncpu >= 2) {
    server_cpus_ = {0};
    for (unsigned c = 1; c < ncpu; ++c) gen_cpus_.push_back(static_cast<int>(c));
  } else {
    o_.pin = false;
  }
  dir_ = std::make_unique<TempDir>("shoal-bench-tracker");
  if (o_.notrack) {
    std::string err = AddNoTrack();
    if (!err.empty()) {
      std::fprintf(stderr, "warning: %s; conntrack may drop connections\n", err.c_str());
      rlimit_note_ += (rlimit_note_.empty() ? "" : "; ") + err;
    }
  }
  for (uint32_t i = 0; i < static_cast<uint32_t>(o_.agents); ++i) {
    Agent a;
    a.id = i;
    a.address = AgentAddress(i);
    a.name = fmt::format("bench-agent-{:05d}", i);
    std::string pid = fmt::format("-LT2080-{:012d}", i);
    a.peer_id_esc = Escape(pid);
    a.key = fmt::format("{:08X}", static_cast<uint32_t>(i * 2654435761u));
    agents_.push_back(std::move(a));
  }
  // The generator's threads; pinned away from the trackers' CPU. The trackers are started
  // before the pinning of this process (children inherit the mask) and pinned themselves.
  StartShoal();
  if (o_.pin) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : gen_cpus_) CPU_SET(c, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  for (int i = 0; i < o_.threads; ++i) {
    gens_.push_back(std::make_unique<Gen>());
    gens_.back()->Start();
  }
  if (auto st = BuildImage(); !st) throw std::runtime_error("image: " + st.error().ToString());
  std::fprintf(
      stderr,
      "image: %.2f GB in %zu layers -> %zu chunk torrents (tracker's layout); %d agents "
      "-> %llu peers; 2,500-node steady load %.0f announces/s\n",
      static_cast<double>(image_.bytes) / 1e9, image_.blobs.size(), image_.chunks.size(), o_.agents,
      static_cast<unsigned long long>(static_cast<uint64_t>(o_.agents) * image_.chunks.size()),
      SteadyRate());
  auto has = [&](char p) { return o_.phases.find(p) != std::string::npos; };
  pid_t spid = shoal_->pid();
  if (has('a') && !g_stop) PhaseCold(shoal_t_, spid);
  if (has('c') && !g_stop) PhaseClosed(shoal_t_, spid, 0);
  for (double m : o_.rates) {
    if (has('b') && !g_stop) PhaseSteady(shoal_t_, spid, m);
  }
  if (has('c') && o_.keepalive && !g_stop) PhaseClosed(shoal_t_, spid, 1);
  if (has('c') && o_.batch > 0 && !g_stop) PhaseClosed(shoal_t_, spid, 2);
  if (auto m = HttpGet("http://" + shoal_t_.host + "/metrics"); m && m.value().status == 200) {
    shoal_metrics_ = m.value().body;
  }
  if (!shoal_->Running())
    std::fprintf(stderr, "shoal-tracker exited: %s\n", shoal_->LogTail().c_str());
  shoal_->Stop();
  if (o_.opentracker && !g_stop) {
    std::string whitelist;
    for (const Chunk& c : image_.chunks) {
      for (unsigned char x : c.ih_bytes) whitelist += fmt::format("{:02x}", x);
      whitelist += "\n";
    }
    if (o_.pin) {
      // Children inherit the generator's mask; the tracker is pinned right after its start.
    }
    StartOpentracker(whitelist);
    pid_t opid = opentracker_->pid();
    if (has('c') && !g_stop) PhaseClosed(ot_t_, opid, 0);
    for (double m : o_.rates) {
      if (has('b') && !g_stop) PhaseSteady(ot_t_, opid, m);
    }
    if (!opentracker_->Running()) {
      std::fprintf(stderr, "opentracker exited: %s\n", opentracker_->LogTail().c_str());
    }
    opentracker_->Stop();
  }
  for (auto& g : gens_) g->Finish();
  Report();
  return g_stop ? 130 : 0;
}

int Main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "shoal-bench-tracker: simulated agents (distinct peers on 127.10.x.y) against a real "
      "shoal-tracker, and opentracker under the same announce workload. Phases: a = cold "
      "cluster-wide pull through the blob API, c = closed-loop maximum announces/s, b = open-loop "
      "steady state at the re-announce rate of --agents nodes (and --rates multiples)."};
  app.add_option("--agents", o.agents, "Simulated agents (distinct peers)")
      ->check(CLI::Range(1, 60000))
      ->capture_default_str();
  app.add_option("--image-gb", o.image_gb, "Image size in GB (decimal), a fixed layer mix")
      ->check(CLI::Range(0.01, 1000.0))
      ->capture_default_str();
  app.add_option("--phases", o.phases, "Phases to run, of a,b,c (a: shoal only)")
      ->capture_default_str();
  app.add_option("--rates", o.rates, "Phase b: multiples of the steady announce rate")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--steady-seconds", o.steady_seconds, "Phase b: seconds per rate")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--closed-seconds", o.closed_seconds,
                 "Phase c: seconds at most (it announces every agent x torrent pair once, so that "
                 "phase b runs against full tables)")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--keepalive-seconds", o.keepalive_seconds,
                 "Phase c over keep-alive connections: seconds at most")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--concurrency", o.concurrency, "Phase c: announces in flight")
      ->check(CLI::Range(1, 20000))
      ->capture_default_str();
  app.add_option("--keepalive", o.keepalive,
                 "Phase c once more over keep-alive connections (shoal only; libtorrent closes)")
      ->capture_default_str();
  app.add_option("--batch", o.batch,
                 "Phase c once more in POST /v1/announces batches of this many announces, as "
                 "agents with --tracker-announce batch send them (shoal only; 0: not run)")
      ->check(CLI::Range(0, 512))
      ->capture_default_str();
  app.add_option("--batch-seconds", o.batch_seconds, "Phase c in batches: seconds at most")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--cold-seconds", o.cold_seconds, "Phase a: seconds at most")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--start-spread", o.start_spread_s, "Phase a: agents start over this many seconds")
      ->check(CLI::Range(0.0, 600.0))
      ->capture_default_str();
  app.add_option("--parallel-blobs", o.parallel_blobs, "Phase a: layers an agent pulls at once")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--window", o.window, "Phase a: chunks of a blob in flight (--range-streams)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--node-gbit", o.node_gbit, "Phase a: each node's link, Gbit/s")
      ->check(CLI::Range(0.01, 1000.0))
      ->capture_default_str();
  app.add_option("--upstream-gbit", o.upstream_gbit,
                 "Phase a: the NAT link, Gbit/s, split over --max-fetchers leases")
      ->check(CLI::Range(0.01, 1000.0))
      ->capture_default_str();
  app.add_option("--max-fetchers", o.max_fetchers,
                 "Phase a: the tracker's --max-upstream-fetchers (for the upstream share)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--threads", o.threads, "Generator threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--timeout-ms", o.timeout_ms, "Announce timeout")
      ->check(CLI::Range(100, 600000))
      ->capture_default_str();
  app.add_option("--max-inflight", o.max_inflight,
                 "Phase b: announces in flight at most (beyond, a scheduled one is dropped and "
                 "counted as an error)")
      ->capture_default_str();
  app.add_option("--pin", o.pin, "Pin the trackers to CPU 0 and the generator to the others")
      ->capture_default_str();
  app.add_option("--notrack", o.notrack,
                 "Exempt the generator's addresses (127.10.0.0/16) from conntrack with iptables "
                 "raw NOTRACK rules, removed at exit (connection-close announces otherwise fill "
                 "nf_conntrack_max with TIME_WAIT entries)")
      ->capture_default_str();
  app.add_option("--opentracker", o.opentracker, "Run opentracker under phases b and c too")
      ->capture_default_str();
  app.add_option("--transport", o.transport,
                 "Announces over http (a TCP connection each, as libtorrent sends them) or udp "
                 "(BEP 15, one datagram each way after a connect every 60 s; shoal's key as "
                 "BEP 41 URL data): for shoal and opentracker alike")
      ->check(CLI::IsMember({"http", "udp"}))
      ->capture_default_str();
  app.add_option("--opentracker-bin", o.opentracker_bin, "opentracker binary")
      ->capture_default_str();
  app.add_option("--tracker-bin", o.tracker_bin, "shoal-tracker binary")->capture_default_str();
  app.add_option("--tracker-arg", o.tracker_args,
                 "Extra shoal-tracker flag (repeat; e.g. --tracker-arg=--max-connections=65536)");
  app.add_option("--json", o.json_out, "Also write the results as JSON to this file");
  app.add_option("--seed", o.seed, "Seed of the shuffles and start times")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  Bench bench(std::move(o));
  return bench.Run();
}

}  // namespace
}  // namespace shoal::testkit

int main(int argc, char** argv) {
  // Ctrl-C: the phases stop at once (every loop checks g_stop), the children are stopped by the
  // unwinding Bench; a second signal, or no progress within 20 s, kills them and exits.
  signal(SIGPIPE, SIG_IGN);
  shoal::testkit::HandleInterruptsOnThread([](int sig) {
    std::fprintf(stderr, "\nshoal-bench-tracker: interrupted (signal %d), stopping\n", sig);
    shoal::testkit::g_stop = true;
    for (int i = 0; i < 200; ++i) {
      struct timespec ts {
        0, 100'000'000
      };
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGINT) || sigismember(&pending, SIGTERM)) break;
      nanosleep(&ts, nullptr);
    }
    shoal::testkit::KillAllChildren();
    shoal::testkit::RunCleanup();
    std::fflush(stdout);
    _exit(130);
  });
  int rc = 1;
  try {
    rc = shoal::testkit::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nshoal-bench-tracker: %s\n", e.what());
    shoal::testkit::KillAllChildren();
    rc = 1;
  }
  shoal::testkit::RunCleanup();
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);
}
