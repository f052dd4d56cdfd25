// shoal-bench-peers: how fast, and at what CPU cost, one node takes a large blob from warm peers
// on loopback (no shaping: the node, not the network, sets the pace), next to a plain BitTorrent
// client measured in the same run on the same bytes.
//
//   shoal (TLS peers, the default) and shoal-plain (--insecure-peers): a shoal-tracker, W warm
//     seeding agents (each pulled the blob through its shim: the first from docker-registry,
//     the others from it), then a fresh receiving agent GETs the blob through its shim while the
//     seeders serve it. Every round uses a new receiver with an empty cache.
//   aria2c: the same blob file as a v1 torrent (the piece size shoal's tracker picked), W aria2c
//     seeders and one aria2c leecher, announced through opentracker.
//   cold: the first seeder's pull from docker-registry (the upstream path), beside
//     docker-registry's own CPU for serving it.
//
// Reported per scenario: wall time and MB/s into the receiver, the receiver's CPU seconds per GiB
// received, the seeders' CPU seconds per GiB sent, and the machine's load. Everything runs on
// 127.0.0.1 in a temp dir that is removed at the end. A program, not a test: never run by ctest.

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <libtorrent/bencode.hpp>
#include <libtorrent/create_torrent.hpp>
#include <libtorrent/file_storage.hpp>
#include <libtorrent/torrent_info.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/agent.h"
#include "tests/support/blob_get.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/proc_stats.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/tokens.h"
#include "tests/support/tracker.h"

namespace shoal::testkit {
namespace {

namespace fs = std::filesystem;
namespace lt = libtorrent;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr char kRepo[] = "bench/peers";
constexpr double kGiB = 1024.0 * 1024 * 1024;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::atomic<bool> g_stop{false};

void OnSignal(int sig) {
  if (g_stop.exchange(true)) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

struct HarnessError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void CheckStop() {
  if (g_stop) throw HarnessError("interrupted");
}

// CPU seconds of the reaped children of this process (getrusage RUSAGE_CHILDREN).
double ReapedChildrenCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

double CpuOf(const std::vector<pid_t>& pids) {
  double s = 0;
  for (pid_t p : pids) s += ProcessCpuSeconds(p);
  return s;
}

uint16_t PortOf(const std::string& host_port) {
  return static_cast<uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1)));
}

// One measured transfer into the receiver.
struct Round {
  double seconds = 0;
  uint64_t bytes = 0;
  double receiver_cpu_s = 0;
  double seeders_cpu_s = 0;
  double seeders_sent = 0;   // payload bytes the seeders sent (their metrics; aria2c: = bytes)
  double from_upstream = 0;  // shoal: bytes the receiver fetched from upstream (should be 0)
  double from_peers = 0;     // shoal: bytes the receiver got from peers
  double receiver_rss_mib = 0;
  double Mbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0; }
  double RecvPerGiB() const { return receiver_cpu_s / (static_cast<double>(bytes) / kGiB); }
  double SendPerGiB() const { return seeders_sent > 0 ? seeders_cpu_s / (seeders_sent / kGiB) : 0; }
};

struct Scenario {
  std::string name;
  std::vector<Round> rounds;
  std::string note;
  // The round with the median receiver CPU per GiB.
  const Round* Median() const {
    if (rounds.empty()) return nullptr;
    std::vector<const Round*> v;
    for (const auto& r : rounds) v.push_back(&r);
    std::sort(v.begin(), v.end(),
              [](const Round* a, const Round* b) { return a->RecvPerGiB() < b->RecvPerGiB(); });
    return v[v.size() / 2];
  }
};

struct Options {
  uint64_t mib = 1024;
  int seeders = 3;
  int rounds = 3;
  std::vector<std::string> scenarios = {"shoal", "shoal-plain", "aria2c"};
  std::vector<std::string> agent_args;
  std::string json_path;
  int piece_kib = 0;  // aria2c's torrent; 0: the piece size shoal's tracker picked
};

// The chunk table the tracker made for digest: {"chunk_size", "piece_size", "chunks"...}.
json ChunkTable(const TrackerProcess& tracker, const Digest& digest) {
  auto r = HttpGet(tracker.Url() + "/v1/blobs/" + digest.str(), AgentAuth());
  if (!r || r.value().status != 200) return json();
  return json::parse(r.value().body, nullptr, false);
}

// ---- shoal ------------------------------------------------------------------------------------

class ShoalRun {
 public:
  ShoalRun(const Options& o, const Registry& upstream, const TempDir& dir, bool plain)
      : o_(o), upstream_(upstream), dir_(dir), plain_(plain) {
    std::vector<std::string> targs;
    if (plain_) targs = {"--peer-ca-cert", ""};  // plain chunk torrents are accepted
    auto t = TrackerProcess::Start(targs);
    if (!t) throw HarnessError("shoal-tracker: " + t.error().ToString());
    tracker_ = std::move(t.value());
  }

  std::unique_ptr<Agent> StartAgent(const std::string& id) {
    AgentOptions a;
    a.cache_dir = dir_.Sub(std::string(plain_ ? "plain-" : "tls-") + id + "-" +
                           std::to_string(++agents_started_));
    a.upstreams = {"docker.io=" + upstream_.Url()};
    a.extra_args = {"--tracker", tracker_->Url(), "--swarm-listen", "127.0.0.1:0", "--agent-id", id,
                    "--log-level", "info"};  // the test kit's default, debug, costs CPU
    if (plain_) a.extra_args.push_back("--insecure-peers");
    a.extra_args.insert(a.extra_args.end(), o_.agent_args.begin(), o_.agent_args.end());
    auto started = Agent::Start(a);
    if (!started) throw HarnessError("shoal-agent " + id + ": " + started.error().ToString());
    return std::move(started.value());
  }

  static BlobGet Get(const Agent& agent, const std::string& target, uint64_t size) {
    BlobGetOptions g;
    g.stop = &g_stop;
    g.user_agent = "shoal-bench-peers";
    return GetBlob(PortOf(agent.HostPort()), target, size, g);
  }

  // Seeder 0 pulls from upstream (the cold path: measured), the others then from the swarm.
  Round Warm(const std::string& target, uint64_t size) {
    seeders_.push_back(StartAgent("seed0"));
    Round cold;
    double a0 = ProcessCpuSeconds(seeders_[0]->pid());
    double r0 = ProcessCpuSeconds(upstream_.pid());
    BlobGet g = Get(*seeders_[0], target, size);
    if (!g.error.empty()) throw HarnessError("cold pull: " + g.error + "\n" + seeders_[0]->LogTail());
    cold.seconds = g.seconds;
    cold.bytes = g.bytes;
    cold.receiver_cpu_s = ProcessCpuSeconds(seeders_[0]->pid()) - a0;
    cold.seeders_cpu_s = ProcessCpuSeconds(upstream_.pid()) - r0;  // docker-registry serving
    cold.seeders_sent = static_cast<double>(g.bytes);
    cold.from_upstream = seeders_[0]->Metric("shoal_upstream_blob_bytes_total");
    for (int i = 1; i < o_.seeders; ++i) {
      CheckStop();
      seeders_.push_back(StartAgent("seed" + std::to_string(i)));
      BlobGet w = Get(*seeders_.back(), target, size);
      if (!w.error.empty()) {
        throw HarnessError("warming seeder " + std::to_string(i) + ": " + w.error + "\n" +
                           seeders_.back()->LogTail());
      }
    }
    return cold;
  }

  // A fresh receiver GETs the blob from the warm seeders.
  Round Receive(const std::string& target, uint64_t size) {
    CheckStop();
    auto receiver = StartAgent("recv");
    std::vector<pid_t> seeder_pids;
    double sent0 = 0;
    for (const auto& s : seeders_) {
      seeder_pids.push_back(s->pid());
      sent0 += s->Metric("shoal_swarm_payload_uploaded_bytes_total");
    }
    Round r;
    double c0 = ProcessCpuSeconds(receiver->pid());
    double s0 = CpuOf(seeder_pids);
    BlobGet g = Get(*receiver, target, size);
    r.receiver_cpu_s = ProcessCpuSeconds(receiver->pid()) - c0;
    r.seeders_cpu_s = CpuOf(seeder_pids) - s0;
    if (!g.error.empty()) throw HarnessError("receiver: " + g.error + "\n" + receiver->LogTail());
    r.seconds = g.seconds;
    r.bytes = g.bytes;
    r.receiver_rss_mib = static_cast<double>(StatusBytes(receiver->pid(), "VmHWM")) / (1 << 20);
    double sent1 = 0;
    for (const auto& s : seeders_) sent1 += s->Metric("shoal_swarm_payload_uploaded_bytes_total");
    r.seeders_sent = sent1 - sent0;
    r.from_upstream = receiver->Metric("shoal_upstream_blob_bytes_total");
    r.from_peers = receiver->Metric("shoal_swarm_peer_bytes_total");
    receiver->Stop();
    return r;
  }

  const TrackerProcess& tracker() const { return *tracker_; }

 private:
  const Options& o_;
  const Registry& upstream_;
  const TempDir& dir_;
  bool plain_;
  int agents_started_ = 0;
  std::unique_ptr<TrackerProcess> tracker_;
  std::vector<std::unique_ptr<Agent>> seeders_;
};

// ---- aria2c -----------------------------------------------------------------------------------

// Writes a v1 .torrent of `file` (announce: `announce`) with the given piece size; returns its
// info-hash in hex.
std::string MakeTorrent(const std::string& file, const std::string& announce, int piece_size,
                 const std::string& out) {
  lt::file_storage files;
  files.add_file(fs::path(file).filename().string(), static_cast<int64_t>(fs::file_size(file)));
  lt::create_torrent ct(files, piece_size, lt::create_torrent::v1_only);
  ct.add_tracker(announce);
  lt::error_code ec;
  lt::set_piece_hashes(ct, fs::path(file).parent_path().string(), ec);
  if (ec) throw HarnessError("hashing " + file + " for the torrent: " + ec.message());
  std::vector<char> bytes;
  lt::bencode(std::back_inserter(bytes), ct.generate());
  std::ofstream(out, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  lt::error_code parse_ec;
  lt::torrent_info info(lt::span<const char>(bytes.data(), static_cast<std::ptrdiff_t>(bytes.size())),
                        parse_ec, lt::from_span);
  if (parse_ec) throw HarnessError("the torrent just made does not parse: " + parse_ec.message());
  std::ostringstream hex;
  hex << info.info_hashes().v1;
  return hex.str();
}

std::vector<std::string> Aria2Common(uint16_t port) {
  return {"aria2c",
          "--enable-dht=false",
          "--enable-dht6=false",
          "--bt-enable-lpd=false",
          "--enable-peer-exchange=false",
          "--listen-port=" + std::to_string(port),
          "--summary-interval=0",
          "--show-console-readout=false",
          "--console-log-level=warn",
          "--bt-tracker-connect-timeout=5",
          "--bt-stop-timeout=0",
          "--file-allocation=none",
          "--check-certificate=false"};
}

Scenario RunAria2(const Options& o, const TempDir& dir, const std::string& blob_file,
                  int piece_size) {
  Scenario sc{"aria2c", {}, ""};
  uint16_t tport = FreePort();
  const std::string announce = "http://127.0.0.1:" + std::to_string(tport) + "/announce";
  // The seeders share one directory holding the blob (the page cache is warm: it was just
  // written and read).
  std::string seed_dir = dir.Sub("aria2-seed");
  fs::create_directories(seed_dir);
  const std::string name = "blob";
  // A scenario named twice (--scenarios aria2c,shoal,aria2c) finds the link of its first run.
  fs::remove(seed_dir + "/" + name);
  fs::create_hard_link(blob_file, seed_dir + "/" + name);
  const std::string torrent = dir.Sub("blob.torrent");
  std::string info_hash = MakeTorrent(seed_dir + "/" + name, announce, piece_size, torrent);
  // Debian's opentracker is built with a whitelist: it tracks only the info-hashes listed. It
  // reads the list as "nobody" (it refuses to run as root), so the temp dir gets o+x.
  std::ofstream(dir.Sub("opentracker.whitelist")) << info_hash << "\n";
  fs::permissions(dir.path(), fs::perms::others_exec, fs::perm_options::add);
  fs::permissions(dir.Sub("opentracker.whitelist"), fs::perms::others_read, fs::perm_options::add);
  auto otr = Process::Start({"opentracker", "-i", "127.0.0.1", "-p", std::to_string(tport), "-P",
                             std::to_string(tport), "-w", dir.Sub("opentracker.whitelist")},
                            dir.Sub("opentracker.log"));
  if (!otr) throw HarnessError("opentracker: " + otr.error().ToString());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  if (!otr.value()->Running()) throw HarnessError("opentracker exited: " + otr.value()->LogTail());
  std::vector<std::unique_ptr<Process>> seeders;
  std::vector<pid_t> pids;
  for (int i = 0; i < o.seeders; ++i) {
    auto argv = Aria2Common(FreePort());
    argv.insert(argv.end(), {"--dir=" + seed_dir, "--bt-seed-unverified=true", "--seed-ratio=0.0",
                             "--check-integrity=false", torrent});
    auto p = Process::Start(argv, dir.Sub("aria2-seed" + std::to_string(i) + ".log"));
    if (!p) throw HarnessError("aria2c seeder: " + p.error().ToString());
    pids.push_back(p.value()->pid());
    seeders.push_back(std::move(p.value()));
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));  // let the seeders announce
  for (int r = 0; r < o.rounds; ++r) {
    CheckStop();
    std::string out = dir.Sub("aria2-leech" + std::to_string(r));
    fs::remove_all(out);  // left by an earlier aria2c scenario of this run: aria2c would resume
    fs::create_directories(out);
    auto argv = Aria2Common(FreePort());
    argv.insert(argv.end(), {"--dir=" + out, "--seed-time=0", torrent});
    double c0 = ReapedChildrenCpuSeconds();
    double s0 = CpuOf(pids);
    auto t0 = Clock::now();
    auto res = RunCommand(argv, std::chrono::seconds(120));
    Round rd;
    rd.seconds = Seconds(Clock::now() - t0);
    rd.receiver_cpu_s = ReapedChildrenCpuSeconds() - c0;
    rd.seeders_cpu_s = CpuOf(pids) - s0;
    std::error_code ec;
    uint64_t got = fs::file_size(out + "/" + name, ec);
    if (!res || ec || got != fs::file_size(blob_file)) {
      throw HarnessError("aria2c leecher: " + (res ? "short file" : res.error().ToString()));
    }
    rd.bytes = got;
    rd.seeders_sent = static_cast<double>(got);  // aria2c's leecher got every byte from them
    sc.rounds.push_back(rd);
    fs::remove_all(out);
    std::printf("  aria2c round %d: %.2f s, %.0f MB/s, leecher %.2f core-s/GiB\n", r + 1,
                rd.seconds, rd.Mbps(), rd.RecvPerGiB());
    std::fflush(stdout);
  }
  for (auto& s : seeders) s->Stop();
  otr.value()->Stop();
  sc.note = "aria2c verifies SHA-1 pieces only (no whole-blob SHA-256); its leecher's CPU is "
            "getrusage of the reaped process";
  return sc;
}

// ---- Report -----------------------------------------------------------------------------------

void PrintTable(const std::vector<Scenario>& scenarios, const Round& cold) {
  std::printf("\n%-28s %8s %9s %13s %13s %9s\n", "scenario (median round)", "seconds", "MB/s",
              "recv core-s", "send core-s", "recv RSS");
  std::printf("%-28s %8s %9s %13s %13s %9s\n", "", "", "", "per GiB in", "per GiB out", "MiB");
  for (const auto& s : scenarios) {
    const Round* m = s.Median();
    if (!m) continue;
    std::printf("%-28s %8.2f %9.0f %13.2f %13.2f %9.0f\n", s.name.c_str(), m->seconds, m->Mbps(),
                m->RecvPerGiB(), m->SendPerGiB(), m->receiver_rss_mib);
  }
  if (cold.bytes > 0) {
    std::printf("%-28s %8.2f %9.0f %13.2f %13.2f %9s\n", "cold: agent <- docker-registry",
                cold.seconds, cold.Mbps(), cold.RecvPerGiB(), cold.SendPerGiB(), "");
  }
  std::printf(
      "\nrecv: the receiving process's utime+stime over the transfer / GiB received (shoal: the\n"
      "agent, which also hashes every piece (SHA-1) and the whole blob (SHA-256) and streams it to\n"
      "the client; the client's own CPU is not counted). send: all seeders' CPU / GiB they sent\n"
      "(cold: docker-registry's CPU serving the blob). Goals (issue 16): recv <= 1.7, send <= 0.5,\n"
      ">= 1000 MB/s.\n");
}

json RoundJson(const Round& r) {
  return {{"seconds", r.seconds},          {"bytes", r.bytes},
          {"mbps", r.Mbps()},              {"receiver_cpu_s", r.receiver_cpu_s},
          {"seeders_cpu_s", r.seeders_cpu_s}, {"seeders_sent", r.seeders_sent},
          {"recv_core_s_per_gib", r.RecvPerGiB()}, {"send_core_s_per_gib", r.SendPerGiB()},
          {"from_upstream", r.from_upstream}, {"from_peers", r.from_peers},
          {"receiver_rss_mib", r.receiver_rss_mib}};
}

int Main(int argc, char** argv) {
  CLI::App app{
      "shoal-bench-peers: one node takes a large blob from W warm peers on loopback (no "
      "shaping): throughput and CPU per GiB of shoal (TLS and plain peers) next to aria2c"};
  Options o;
  app.add_option("--mib", o.mib, "Blob size in MiB")->check(CLI::Range(16, 65536))->capture_default_str();
  app.add_option("--seeders", o.seeders, "Warm seeders (W)")->check(CLI::Range(1, 16))->capture_default_str();
  app.add_option("--rounds", o.rounds, "Receiving rounds per scenario (the median is reported)")
      ->check(CLI::Range(1, 20))
      ->capture_default_str();
  app.add_option("--scenarios", o.scenarios, "Scenarios to run, in this order")
      ->delimiter(',')
      ->check(CLI::IsMember({"shoal", "shoal-plain", "aria2c"}))
      ->capture_default_str();
  app.add_option("--agent-arg", o.agent_args, "Extra shoal-agent argument (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--piece-kib", o.piece_kib,
                 "aria2c torrent's piece size in KiB (default: the piece size shoal's tracker "
                 "picked for the blob)");
  app.add_option("--json", o.json_path, "Also write the results as JSON to this file");
  std::string work_dir;
  app.add_option("--work-dir", work_dir, "Where the temp dir goes (default $TMPDIR or /tmp)");
  CLI11_PARSE(app, argc, argv);
  if (!work_dir.empty()) setenv("TMPDIR", work_dir.c_str(), 1);
  spdlog::set_level(spdlog::level::warn);
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  for (const char* tool : {"docker-registry", "skopeo", "aria2c", "opentracker"}) {
    if (!RunCommand({"sh", "-c", std::string("command -v ") + tool}, std::chrono::seconds(10))) {
      throw HarnessError(std::string(tool) + " is not installed (scripts/setup.sh installs it)");
    }
  }
  std::printf("machine: %s; load average at start: %s\n", MachineSummary().c_str(),
              LoadAverage().c_str());
  TempDir dir("shoal-bench-peers");

  // The blob: one uncompressed layer holding one big file.
  auto t0 = Clock::now();
  auto registry = Registry::Start();
  if (!registry) throw HarnessError("docker-registry: " + registry.error().ToString());
  Registry& reg = *registry.value();
  ImageSpec spec;
  spec.layers = {LayerSpec{.compression = Compression::kNone,
                           .small_files = 0,
                           .big_files = {o.mib << 20},
                           .seed = 11,
                           .with_symlink_and_hardlink = false}};
  auto image = BuildImage(spec, dir.Sub("layout"), "1");
  if (!image) throw HarnessError("image build: " + image.error().ToString());
  if (auto st = PushImage(reg, image.value().layout_dir, "1", kRepo); !st) {
    throw HarnessError("push: " + st.error().ToString());
  }
  const Digest digest = image.value().layer_digests[0];
  const uint64_t size = image.value().layer_sizes[0];
  const std::string blob_file = reg.BlobDataPath(digest);
  const std::string target = std::string("/v2/") + kRepo + "/blobs/" + digest.str();
  std::printf("blob: %s, %.2f GiB, built and pushed in %.1f s; %d seeders, %d rounds\n",
              digest.str().substr(0, 19).c_str(), static_cast<double>(size) / kGiB,
              Seconds(Clock::now() - t0), o.seeders, o.rounds);
  std::fflush(stdout);

  std::vector<Scenario> results;
  std::optional<Round> cold;
  int piece_size = o.piece_kib * 1024;
  std::string layout_line;
  for (const auto& name : o.scenarios) {
    CheckStop();
    if (name == "shoal" || name == "shoal-plain") {
      bool plain = name == "shoal-plain";
      std::printf("%s: tracker + %d seeders (%s peers) warming ...\n", name.c_str(), o.seeders,
                  plain ? "plain TCP" : "TLS");
      std::fflush(stdout);
      ShoalRun run(o, reg, dir, plain);
      Round c = run.Warm(target, size);
      if (!cold) cold = c;
      json table = ChunkTable(run.tracker(), digest);
      if (table.is_object() && table.contains("piece_size")) {
        if (piece_size == 0) piece_size = table["piece_size"].get<int>();
        layout_line = std::to_string(table["chunks"].size()) + " chunks of up to " +
                      std::to_string(table["chunk_size"].get<uint64_t>() >> 20) + " MiB, pieces of " +
                      std::to_string(table["piece_size"].get<uint64_t>() >> 10) + " KiB";
      }
      Scenario sc{name, {}, ""};
      for (int r = 0; r < o.rounds; ++r) {
        Round rd = run.Receive(target, size);
        std::printf("  %s round %d: %.2f s, %.0f MB/s, receiver %.2f core-s/GiB, seeders %.2f "
                    "core-s/GiB sent; from upstream %.0f bytes\n",
                    name.c_str(), r + 1, rd.seconds, rd.Mbps(), rd.RecvPerGiB(), rd.SendPerGiB(),
                    rd.from_upstream);
        std::fflush(stdout);
        if (rd.from_upstream > 0) sc.note = "the receiver fetched some bytes from upstream";
        sc.rounds.push_back(rd);
      }
      results.push_back(std::move(sc));
    } else if (name == "aria2c") {
      if (piece_size == 0) piece_size = 2 << 20;
      std::printf("aria2c: opentracker + %d aria2c seeders, pieces of %d KiB ...\n", o.seeders,
                  piece_size >> 10);
      std::fflush(stdout);
      results.push_back(RunAria2(o, dir, blob_file, piece_size));
    }
  }
  if (!layout_line.empty()) std::printf("\nshoal's tracker cut the blob into %s\n", layout_line.c_str());
  PrintTable(results, cold.value_or(Round{}));
  for (const auto& s : results) {
    if (!s.note.empty()) std::printf("note (%s): %s\n", s.name.c_str(), s.note.c_str());
  }
  std::printf("load average at the end: %s\n", LoadAverage().c_str());
  if (!o.json_path.empty()) {
    json out = {{"benchmark", "shoal-bench-peers"},
                {"machine", MachineSummary()},
                {"blob_bytes", size},
                {"seeders", o.seeders},
                {"layout", layout_line},
                {"scenarios", json::array()}};
    for (const auto& s : results) {
      json rounds = json::array();
      for (const auto& r : s.rounds) rounds.push_back(RoundJson(r));
      out["scenarios"].push_back({{"name", s.name}, {"rounds", rounds}, {"note", s.note}});
    }
    if (cold) out["cold"] = RoundJson(*cold);
    std::ofstream(o.json_path) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace shoal::testkit

int main(int argc, char** argv) {
  try {
    return shoal::testkit::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nshoal-bench-peers: %s\n", e.what());
    return 1;
  }
}
