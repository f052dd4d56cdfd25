// shoal-tracker with real BitTorrent clients on loopback: Debian's aria2c seeding and downloading
// through it, and libtorrent sessions (as the agents will run them) announcing to it.

#include <doctest/doctest.h>

#include <utility>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <libtorrent/add_torrent_params.hpp>
#include <libtorrent/alert_types.hpp>
#include <libtorrent/bdecode.hpp>
#include <libtorrent/bencode.hpp>
#include <libtorrent/create_torrent.hpp>
#include <libtorrent/session.hpp>
#include <libtorrent/session_params.hpp>
#include <libtorrent/settings_pack.hpp>
#include <libtorrent/torrent_flags.hpp>
#include <libtorrent/torrent_info.hpp>

#include "lib/auth/tokens.h"
#include "lib/core/base64.h"
#include "lib/http/url.h"
#include "tests/support/http_client.h"
#include "tests/support/process.h"
#include "tests/support/tokens.h"
#include "tests/support/tracker.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

namespace lt = libtorrent;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A running shoal-tracker on 127.0.0.1 with a port picked by the OS.
struct Tracker {
  std::unique_ptr<TrackerProcess> process;
  std::string base;  // http://127.0.0.1:<port>
  std::string key;   // the test cluster's announce key (announce and scrape take ?auth=<key>)

  std::string AnnounceUrl() const { return base + "/announce?auth=" + key; }
};

Tracker StartTracker(const TempDir& /*dir*/, std::vector<std::string> extra = {}) {
  // The shared fixture (tests/support/tracker.h): port file, log, /healthz wait.
  auto started = TrackerProcess::Start(std::move(extra));
  REQUIRE_MESSAGE(started.has_value(), Why(started));
  Tracker t{std::move(started.value()), "", ""};
  t.base = t.process->Url();
  t.key = auth::AnnounceKey(Tokens().agent);
  return t;
}

// size pseudo-random bytes, the same for a given seed.
std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(size, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

struct Torrent {
  std::string path;       // the .torrent file
  std::string info_hash;  // v1, 20 raw bytes
  std::vector<char> bytes;
};

// A private v1 torrent over the single file data_path, announcing to announce_url.
Torrent MakeTorrent(const std::string& data_path, const std::string& announce_url,
                    const std::string& torrent_path, int piece_size = 64 * 1024) {
  lt::file_storage fs;
  lt::add_files(fs, data_path);
  lt::create_torrent ct(fs, piece_size, lt::create_torrent::v1_only);
  ct.add_tracker(announce_url);
  ct.set_priv(true);
  ct.set_creator("shoal tracker_test");
  lt::error_code ec;
  lt::set_piece_hashes(ct, std::filesystem::path(data_path).parent_path().string(), ec);
  REQUIRE_MESSAGE(!ec, "hashing " << data_path << ": " << ec.message());
  Torrent t;
  lt::bencode(std::back_inserter(t.bytes), ct.generate());
  lt::torrent_info ti(lt::span<const char>(t.bytes), ec, lt::from_span);
  REQUIRE_MESSAGE(!ec, ec.message());
  t.info_hash = ti.info_hashes().v1.to_string();
  t.path = torrent_path;
  WriteFile(torrent_path, std::string(t.bytes.begin(), t.bytes.end()));
  return t;
}

struct Counts {
  int64_t complete = -1, incomplete = -1, downloaded = -1;
};

// The tracker's scrape counts for info_hash; all -1 if the request or the reply failed.
Counts Scrape(const Tracker& tracker, const std::string& info_hash) {
  Counts c;
  auto res = HttpGet(
      tracker.base + "/scrape?auth=" + tracker.key + "&info_hash=" + http::QueryEscape(info_hash),
      {}, seconds(5));
  if (!res || res.value().status != 200) return c;
  const std::string& body = res.value().body;
  lt::error_code ec;
  lt::bdecode_node root = lt::bdecode(lt::span<const char>(body.data(), body.size()), ec);
  if (ec || root.type() != lt::bdecode_node::dict_t) return c;
  lt::bdecode_node file = root.dict_find_dict("files").dict_find_dict(
      lt::string_view(info_hash.data(), info_hash.size()));
  if (!file) return c;
  c.complete = file.dict_find_int_value("complete", -1);
  c.incomplete = file.dict_find_int_value("incomplete", -1);
  c.downloaded = file.dict_find_int_value("downloaded", -1);
  return c;
}

std::string Metrics(const Tracker& tracker) {
  auto res = HttpGet(tracker.base + "/metrics", {}, seconds(5));
  return res ? res.value().body : "";
}

// aria2c flags for a closed loopback swarm: tracker only, no DHT/LPD/PEX, plain TCP.
std::vector<std::string> Aria2Argv(const std::string& dir, uint16_t listen_port,
                                   const std::string& log) {
  return {"aria2c", "--no-conf=true", "--dir=" + dir, "--enable-dht=false", "--enable-dht6=false",
          "--bt-enable-lpd=false", "--enable-peer-exchange=false", "--bt-require-crypto=false",
          "--disable-ipv6=true",
          // A short range: if another process took the port since FreePort(), aria2c uses the
          // next free one (it announces whichever it bound).
          "--listen-port=" + std::to_string(listen_port) + "-" +
              std::to_string(std::min(listen_port + 20, 65535)),
          "--bt-tracker-interval=1", "--bt-tracker-connect-timeout=5", "--bt-tracker-timeout=5",
          "--file-allocation=none", "--summary-interval=0", "--console-log-level=warn",
          "--log=" + log, "--log-level=info"};
}

}  // namespace

TEST_CASE("tracker: aria2c seeds and a second aria2c downloads through the tracker") {
  TempDir dir("shoal-tracker-aria2");
  Tracker tracker = StartTracker(dir);
  std::filesystem::create_directories(dir.Sub("seed"));
  std::filesystem::create_directories(dir.Sub("leech"));
  std::string data = RandomBytes(3 * 1024 * 1024 + 12345, 7);
  WriteFile(dir.Sub("seed/blob.bin"), data);
  Torrent torrent =
      MakeTorrent(dir.Sub("seed/blob.bin"), tracker.AnnounceUrl(), dir.Sub("blob.torrent"));

  // The seeder checks the file it already has, then announces as a seeder, forever.
  std::vector<std::string> seed_argv =
      Aria2Argv(dir.Sub("seed"), FreePort(), dir.Sub("seed.aria2.log"));
  seed_argv.insert(seed_argv.end(), {"--check-integrity=true", "--seed-ratio=0.0", torrent.path});
  auto seeder = Process::Start(seed_argv, dir.Sub("seed.out"));
  REQUIRE_MESSAGE(seeder.has_value(), Why(seeder));
  bool seeding = WaitUntil(
      [&] {
        return !seeder.value()->Running() || Scrape(tracker, torrent.info_hash).complete == 1;
      },
      seconds(30), milliseconds(100));
  REQUIRE_MESSAGE(seeding, "the seeder never announced: " << seeder.value()->LogTail() << "\n"
                                                          << tracker.process->LogTail());
  REQUIRE_MESSAGE(seeder.value()->Running(), seeder.value()->LogTail());

  // The leecher knows only the tracker; it exits once the file is complete (no seeding).
  std::vector<std::string> leech_argv =
      Aria2Argv(dir.Sub("leech"), FreePort(), dir.Sub("leech.aria2.log"));
  leech_argv.insert(leech_argv.end(), {"--seed-time=0", "--bt-stop-timeout=60", torrent.path});
  auto leeched = RunCommand(leech_argv, seconds(120));
  REQUIRE_MESSAGE(leeched.has_value(),
                  leeched.error().message << "\n"
                                          << ReadFile(dir.Sub("leech.aria2.log")).substr(0, 20000));
  CHECK(ReadFile(dir.Sub("leech/blob.bin")) == data);

  // The swarm is on the scrape and the status page; the finished download was counted.
  Counts counts;
  bool counted = WaitUntil(
      [&] {
        counts = Scrape(tracker, torrent.info_hash);
        return counts.complete >= 1 && counts.downloaded >= 1;
      },
      seconds(10), milliseconds(100));
  CHECK_MESSAGE(counted, "scrape: complete " << counts.complete << ", incomplete "
                                             << counts.incomplete << ", downloaded "
                                             << counts.downloaded);
  auto page = HttpGet(tracker.base + "/", OperatorAuth());
  REQUIRE(page.has_value());
  std::string hex;
  for (unsigned char c : torrent.info_hash) {
    static constexpr char kDigits[] = "0123456789abcdef";
    hex += kDigits[c >> 4];
    hex += kDigits[c & 15];
  }
  CHECK(page.value().body.find(hex) != std::string::npos);
  std::string metrics = Metrics(tracker);
  CHECK(MetricSum(metrics, "shoal_tracker_announces_total", {{"event", "started"}}) >= 2);
  // aria2c --seed-time=0 stops right away (left=0) without a completed event.
  CHECK(MetricSum(metrics, "shoal_tracker_announces_total", {{"event", "stopped"}}) >= 1);

  seeder.value()->Stop();
  CHECK(tracker.process->Stop() == 0);  // SIGTERM: a clean exit
}

TEST_CASE("tracker: libtorrent sessions announce, receive each other and transfer a torrent") {
  TempDir dir("shoal-tracker-lt");
  Tracker tracker = StartTracker(dir);
  std::filesystem::create_directories(dir.Sub("seed"));
  std::filesystem::create_directories(dir.Sub("leech"));
  std::string data = RandomBytes(2 * 1024 * 1024 + 777, 9);
  WriteFile(dir.Sub("seed/blob.bin"), data);
  Torrent torrent = MakeTorrent(dir.Sub("seed/blob.bin"), tracker.AnnounceUrl(),
                                dir.Sub("blob.torrent"), 256 * 1024);

  // Settings for a private LAN swarm (docs: libtorrent.md): no DHT/LSD/UPnP/NAT-PMP, TCP only,
  // several sessions on one IP.
  auto settings = [] {
    lt::settings_pack s;
    s.set_bool(lt::settings_pack::enable_dht, false);
    s.set_bool(lt::settings_pack::enable_lsd, false);
    s.set_bool(lt::settings_pack::enable_upnp, false);
    s.set_bool(lt::settings_pack::enable_natpmp, false);
    s.set_bool(lt::settings_pack::enable_outgoing_utp, false);
    s.set_bool(lt::settings_pack::enable_incoming_utp, false);
    s.set_bool(lt::settings_pack::allow_multiple_connections_per_ip, true);
    s.set_str(lt::settings_pack::listen_interfaces, "127.0.0.1:0");
    s.set_int(lt::settings_pack::alert_mask,
              lt::alert_category::error | lt::alert_category::status | lt::alert_category::tracker);
    return s;
  };
  auto add = [&](lt::session& session, const std::string& save_path, bool seed) {
    lt::add_torrent_params atp;
    lt::error_code ec;
    atp.ti =
        std::make_shared<lt::torrent_info>(lt::span<const char>(torrent.bytes), ec, lt::from_span);
    REQUIRE_MESSAGE(!ec, ec.message());
    atp.save_path = save_path;
    atp.flags &= ~(lt::torrent_flags::auto_managed | lt::torrent_flags::paused);
    if (seed) atp.flags |= lt::torrent_flags::seed_mode;
    session.add_torrent(std::move(atp), ec);
    REQUIRE_MESSAGE(!ec, ec.message());
  };

  lt::session seed_session{lt::session_params{settings()}};
  add(seed_session, dir.Sub("seed"), true);
  bool seeding = WaitUntil([&] { return Scrape(tracker, torrent.info_hash).complete == 1; },
                           seconds(30), milliseconds(100));
  REQUIRE_MESSAGE(seeding, tracker.process->LogTail());

  lt::session leech_session{lt::session_params{settings()}};
  add(leech_session, dir.Sub("leech"), false);
  bool finished = false;
  int peers_from_tracker = 0;
  std::string errors;
  auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while (!finished && std::chrono::steady_clock::now() < deadline) {
    leech_session.wait_for_alert(milliseconds(200));
    std::vector<lt::alert*> alerts;
    leech_session.pop_alerts(&alerts);
    for (lt::alert* a : alerts) {
      if (auto* reply = lt::alert_cast<lt::tracker_reply_alert>(a)) {
        peers_from_tracker = std::max(peers_from_tracker, reply->num_peers);
      } else if (lt::alert_cast<lt::torrent_finished_alert>(a)) {
        finished = true;
      } else if (a->category() & lt::alert_category::error) {
        errors += a->message() + "\n";
      }
    }
    std::vector<lt::alert*> ignored;
    seed_session.pop_alerts(&ignored);  // keep the seeder's queue from filling up
  }
  REQUIRE_MESSAGE(finished, "download did not finish; errors:\n"
                                << errors << "tracker:\n"
                                << tracker.process->LogTail());
  CHECK(peers_from_tracker == 1);
  // torrent_finished_alert follows the hash checks; libtorrent's own storage may still be
  // writing the last blocks out to the file (seen once under load), so give it a moment.
  CHECK(WaitUntil([&] { return ReadFile(dir.Sub("leech/blob.bin")) == data; }, seconds(10),
                  milliseconds(50)));

  // The leecher's completed event turns it into the swarm's second seeder.
  Counts counts;
  bool two_seeders = WaitUntil(
      [&] {
        counts = Scrape(tracker, torrent.info_hash);
        return counts.complete == 2 && counts.incomplete == 0 && counts.downloaded == 1;
      },
      seconds(20), milliseconds(100));
  CHECK_MESSAGE(two_seeders, "scrape: complete " << counts.complete << ", incomplete "
                                                 << counts.incomplete << ", downloaded "
                                                 << counts.downloaded);
}

TEST_CASE("tracker: answers hostile requests with failures, not crashes, and keeps serving") {
  TempDir dir("shoal-tracker-http");
  Tracker tracker = StartTracker(dir);

  auto bad = HttpGet(tracker.base + "/announce?auth=" + tracker.key +
                     "&info_hash=%zz&peer_id=x&port=1&left=0");
  REQUIRE(bad.has_value());
  CHECK(bad.value().status == 200);
  CHECK(bad.value().body.find("14:failure reason") != std::string::npos);
  CHECK(bad.value().body.find("bad percent-escape") != std::string::npos);

  auto huge =
      HttpGet(tracker.base + "/announce?auth=" + tracker.key + "&" + std::string(6000, 'a'));
  REQUIRE(huge.has_value());
  CHECK(huge.value().body.find("failure reason") != std::string::npos);

  auto headers = HttpGet(tracker.AnnounceUrl(), {{"X-Junk", std::string(20000, 'j')}});
  CHECK((!headers.has_value() || headers.value().status == 400));

  auto missing = HttpGet(tracker.base + "/nope");
  REQUIRE(missing.has_value());
  CHECK(missing.value().status == 404);
  auto post = HttpRequest("POST", tracker.AnnounceUrl(), {}, "");
  REQUIRE(post.has_value());
  CHECK(post.value().status == 405);
  auto full_scrape = HttpGet(tracker.base + "/scrape?auth=" + tracker.key);
  REQUIRE(full_scrape.has_value());
  CHECK(full_scrape.value().body.find("failure reason") != std::string::npos);

  auto health = HttpGet(tracker.base + "/healthz");
  REQUIRE(health.has_value());
  CHECK(health.value().body == "ok\n");
  std::string metrics = Metrics(tracker);
  CHECK(MetricSum(metrics, "shoal_tracker_announce_failures_total", {{"reason", "invalid"}}) == 2);
  CHECK(MetricSum(metrics, "shoal_tracker_http_requests_total", {{"route", "announce"}}) >= 2);
  CHECK(tracker.process->Running());
  CHECK(tracker.process->Stop() == 0);
}

// What a raw TCP client sees: everything received until the tracker closes, or until `wait`.
std::string SendAndReadAll(uint16_t port, const std::vector<std::string>& parts,
                           milliseconds gap, seconds wait = seconds(5)) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  timeval tv{static_cast<time_t>(wait.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) std::this_thread::sleep_for(gap);
    REQUIRE(::send(fd, parts[i].data(), parts[i].size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(parts[i].size()));
  }
  std::string got;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;  // closed by the tracker, or the wait ran out
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

size_t Count(const std::string& text, std::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// An agent's announce (libtorrent sends Connection: close) is answered right after accept,
// without a coroutine; everything else goes to the connection's session with the bytes already
// read. Both must give the same answers.
TEST_CASE("tracker: announces in a batch (POST /v1/announces) need the agent token and register like GET /announce") {
  TempDir dir("shoal-tracker-batch");
  Tracker tracker = StartTracker(dir);
  const std::string url = tracker.base + "/v1/announces";
  const std::string ih(20, 'b');
  auto query = [&](uint16_t port, uint64_t left) {
    return "info_hash=" + http::QueryEscape(ih) + "&peer_id=-LT2080-abcdefghijkl&port=" +
           std::to_string(port) + "&uploaded=0&downloaded=0&left=" + std::to_string(left) +
           "&compact=1";
  };
  const std::string body = query(7100, 0) + "\n" + query(7101, 5) + "\n";
  const std::vector<std::pair<std::string, std::string>> agent = {
      {"Authorization", "Bearer " + Tokens().agent}};

  auto anonymous = HttpRequest("POST", url, {}, body, seconds(5));
  REQUIRE(anonymous.has_value());
  CHECK(anonymous.value().status == 401);
  auto get = HttpRequest("GET", url, agent, "", seconds(5));
  REQUIRE(get.has_value());
  CHECK(get.value().status == 405);
  CHECK(get.value().Header("allow") == "POST");
  auto empty = HttpRequest("POST", url, agent, "", seconds(5));
  REQUIRE(empty.has_value());
  CHECK(empty.value().status == 400);
  CHECK(Scrape(tracker, ih).incomplete == 0);  // the refused calls registered nobody

  auto ok = HttpRequest("POST", url, agent, body, seconds(5));
  REQUIRE(ok.has_value());
  CHECK(ok.value().status == 200);
  CHECK(!ok.value().Header("shoal-tracker-id").empty());
  // Two lines, each the base64 of a bencoded announce reply; the leecher was given the seeder
  // at the call's source address, 127.0.0.1, with its own port.
  const std::string& lines = ok.value().body;
  REQUIRE(std::count(lines.begin(), lines.end(), '\n') == 2);
  auto second = Base64Decode(lines.substr(lines.find('\n') + 1, lines.size() - lines.find('\n') - 2));
  REQUIRE(second.has_value());
  CHECK(second->find("5:peers6:" + std::string("\x7f\x00\x00\x01\x1b\xbc", 6)) !=
        std::string::npos);
  Counts c = Scrape(tracker, ih);
  CHECK(c.complete == 1);
  CHECK(c.incomplete == 1);
  std::string metrics = Metrics(tracker);
  CHECK(MetricSum(metrics, "shoal_tracker_batched_announces_total") == 2);
  CHECK(MetricSum(metrics, "shoal_tracker_http_requests_total",
                  {{"route", "announce-batch"}, {"code", "200"}}) == 1);
}

TEST_CASE("tracker: a request in one piece, in two pieces, pipelined, malformed or HEAD gets the same answers on a raw connection") {
  TempDir dir("shoal-tracker-raw");
  Tracker tracker = StartTracker(dir);
  auto port = static_cast<uint16_t>(std::stoi(tracker.base.substr(tracker.base.rfind(':') + 1)));
  const std::string target = "/announce?auth=" + tracker.key +
                             "&info_hash=%01%02%03%04%05%06%07%08%09%0a%0b%0c%0d%0e%0f%10%11%12"
                             "%13%14&peer_id=-LT2080-abcdefghijkl&port=6881&uploaded=0"
                             "&downloaded=0&left=0&compact=1&event=started";
  const std::string closing =
      "GET " + target + " HTTP/1.1\r\nHost: tracker\r\nConnection: close\r\n\r\n";

  // One piece: answered and closed (the read ends at the tracker's FIN, not at the 5 s wait).
  auto started = std::chrono::steady_clock::now();
  std::string whole = SendAndReadAll(port, {closing}, milliseconds(0));
  CHECK(std::chrono::steady_clock::now() - started < seconds(3));
  CHECK(whole.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(whole.find("Connection: close") != std::string::npos);
  CHECK(whole.find("8:intervali") != std::string::npos);
  CHECK(whole.find("failure reason") == std::string::npos);

  // The same request in two pieces 300 ms apart: the session reads the rest.
  std::string halves = SendAndReadAll(
      port, {closing.substr(0, 40), closing.substr(40)}, milliseconds(300));
  CHECK(halves.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(halves.find("8:intervali") != std::string::npos);

  // Two requests in one write, the first keep-alive: both answered, in order, then closed.
  std::string pipelined = SendAndReadAll(
      port, {"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n" + closing}, milliseconds(0));
  CHECK(Count(pipelined, "HTTP/1.1 200 OK\r\n") == 2);
  CHECK(pipelined.find("ok\n") < pipelined.find("8:intervali"));

  // Malformed in the first read: the session's 400, as before.
  std::string malformed =
      SendAndReadAll(port, {"GET /announce HTTP/1.1\r\nBad Header\r\n\r\n"}, milliseconds(0));
  CHECK(malformed.rfind("HTTP/1.1 400 Bad Request\r\n", 0) == 0);
  CHECK(malformed.find("malformed HTTP request") != std::string::npos);

  // HEAD, closing: headers with the body's length, no body.
  std::string head = SendAndReadAll(
      port, {"HEAD /healthz HTTP/1.0\r\n\r\n"}, milliseconds(0));
  CHECK(head.rfind("HTTP/1.0 200 OK\r\n", 0) == 0);
  CHECK(head.find("Content-Length: 3\r\n") != std::string::npos);
  CHECK(head.substr(head.find("\r\n\r\n") + 4).empty());

  // The tracker counted every one of them and is still serving.
  std::string metrics = Metrics(tracker);
  CHECK(MetricSum(metrics, "shoal_tracker_http_requests_total", {{"route", "announce"}}) == 3);
  CHECK(MetricSum(metrics, "shoal_tracker_http_requests_total", {{"route", "health"}}) >= 2);
  CHECK(tracker.process->Stop() == 0);
}

TEST_CASE("tracker: a connection beyond --max-connections gets 503 with Retry-After, and is counted") {
  TempDir dir("shoal-tracker-shed");
  Tracker tracker = StartTracker(dir, {"--max-connections", "2"});
  auto port = static_cast<uint16_t>(std::stoi(tracker.base.substr(tracker.base.rfind(':') + 1)));
  boost::asio::io_context ioc;
  const boost::asio::ip::tcp::endpoint at(boost::asio::ip::make_address("127.0.0.1"), port);
  // Two connections that started a request take the tracker's whole allowance. (One that sends
  // nothing is not accepted before about a second: TCP_DEFER_ACCEPT.)
  std::vector<boost::asio::ip::tcp::socket> held;
  for (int i = 0; i < 2; ++i) {
    held.emplace_back(ioc);
    held.back().connect(at);
    boost::asio::write(held.back(), boost::asio::buffer(std::string_view("GET /healthz HTTP/1.1\r\n")));
  }
  // The accept loop counts a connection once its coroutine runs: give it a moment.
  std::this_thread::sleep_for(milliseconds(300));
  auto refused = HttpGet(tracker.base + "/healthz", {}, seconds(5));
  REQUIRE_MESSAGE(refused.has_value(), Why(refused));
  CHECK(refused.value().status == 503);
  CHECK(refused.value().Header("retry-after") == "1");
  CHECK(refused.value().body.find("--max-connections") != std::string::npos);
  // One held connection closes: the tracker serves again, and says what it refused.
  held.front().close();
  std::string metrics;
  for (int i = 0; i < 50 && metrics.empty(); ++i) {
    auto r = HttpGet(tracker.base + "/metrics", {}, seconds(5));
    if (r && r.value().status == 200) metrics = r.value().body;
    if (metrics.empty()) std::this_thread::sleep_for(milliseconds(100));
  }
  REQUIRE_FALSE(metrics.empty());
  CHECK(MetricSum(metrics, "shoal_tracker_http_connections_shed_total") >= 1);
  CHECK(tracker.process->LogTail().find("refused with 503") != std::string::npos);
  CHECK(tracker.process->Stop() == 0);
}

}  // namespace shoal::testkit
