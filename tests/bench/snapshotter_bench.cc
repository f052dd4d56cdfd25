// shoal-bench-snapshotter: the time from the kubelet's CRI PullImage to "image ready" for a
// multi-layer image (>= 1 GiB unpacked, gzip layers) on a cold node, with containerd's CRI plugin
// using shoal's snapshotter (issue 18: shoal fetches each layer through its own pull path and
// extracts the image's layers in parallel while they stream in) against containerd's own
// overlayfs snapshotter pulling through the same agent shim (containerd fetches and unpacks each
// layer itself), in the same run, through the same throttled upstream. Two reference points are
// measured in the same rounds: the download alone (every blob through a cold agent's shim, three
// at a time, to nowhere) and the parallel extraction alone (the cached blobs extracted the way
// the snapshotter extracts them: lib/extract, overlay whiteouts, digest and diff ID checked, as
// many layers at a time as the agent's --snapshotter-prepare-workers default).
//
//   shoal-bench-snapshotter [--dir /var/tmp] [--upstream-mbps 300,0] [--rounds 3] [--scale 1]
//
// Every scenario of every round starts cold: a fresh agent (empty cache, and for shoal an empty
// snapshotter root), a fresh containerd (empty root: content store, metadata, snapshots). The
// upstream is Debian's docker-registry behind the test kit's CountingProxy, which caps the
// response bytes of all its connections together at --upstream-mbps (0: no cap, the
// network-fast case: loopback at whatever the CPUs allow). The kernel's page cache is not
// dropped (that is the whole machine's, shared with others); the registry's blobs are read from
// it, and nothing is fsynced by the bench. Each timed scenario starts after `sync`.
//
// Needs root (containerd, overlay mounts, whiteout device nodes). Everything lives in one temp
// dir under --dir, which is removed at the end with every mount under it unmounted and every
// process stopped, also on failure and on Ctrl-C. This is a program, not a test: it is never
// registered with ctest.

#include <pthread.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "lib/core/sha256.h"
#include "lib/extract/byte_source.h"
#include "lib/extract/layer.h"
#include "tests/support/agent.h"
#include "tests/support/blob_get.h"
#include "tests/support/counted_upstream.h"
#include "tests/support/cri.h"
#include "tests/support/image.h"
#include "tests/support/proc_stats.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/runtimes.h"

namespace shoal::testkit {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kRepository[] = "bench/img";  // in the registry; gcr.io/bench/img to containerd
constexpr char kTag[] = "1";
constexpr int kInterruptedExit = 130;
// Layers at a time of the download reference: containerd's CRI max_concurrent_downloads (3),
// which is also the agent's --snapshotter-prepare-workers default.
constexpr unsigned kDownloads = 3;

// Anything that makes the run fail; main reports it after the destructors cleaned up.
struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string Fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* format, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(buf, sizeof(buf), format, ap);
  va_end(ap);
  return buf;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

template <typename T>
T Must(Result<T> r, const std::string& what) {
  if (!r) throw BenchError(what + ": " + r.error().ToString());
  return std::move(r.value());
}

void MustOk(const Status& s, const std::string& what) {
  if (!s) throw BenchError(what + ": " + s.error().ToString());
}

// ---- Cleanup: mounts under the run dir, also from the signal thread ---------------------------

std::mutex g_run_dir_mu;
std::string g_run_dir;  // GUARDED_BY(g_run_dir_mu): the temp dir everything lives in

// Mount points under `dir` in this process's mount table, deepest first.
std::vector<std::string> MountsUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::istringstream in(ReadFile("/proc/self/mounts"));
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string dev, point;
    fields >> dev >> point;
    if (point == dir || point.rfind(dir + "/", 0) == 0) out.push_back(point);
  }
  std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
    return a.size() > b.size();
  });
  return out;
}

// Detaches every mount under `dir` (containerd's unpack mounts, if it was killed mid-layer).
size_t UnmountUnder(const std::string& dir) {
  size_t n = 0;
  for (const std::string& m : MountsUnder(dir)) n += ::umount2(m.c_str(), MNT_DETACH) == 0;
  return n;
}

// The run's temp dir: everything the test kit creates goes in it (TMPDIR points there). Its
// destructor unmounts what is left under it, then TempDir removes it.
class RunDir {
 public:
  explicit RunDir(const std::string& parent) {
    setenv("TMPDIR", parent.c_str(), 1);
    dir_ = std::make_unique<TempDir>("shoal-bench-snapshotter");
    setenv("TMPDIR", dir_->path().c_str(), 1);
    std::lock_guard<std::mutex> lock(g_run_dir_mu);
    g_run_dir = dir_->path();
  }
  ~RunDir() {
    if (size_t n = UnmountUnder(dir_->path()); n > 0) {
      std::fprintf(stderr, "shoal-bench-snapshotter: unmounted %zu leftover mounts\n", n);
    }
    {
      std::lock_guard<std::mutex> lock(g_run_dir_mu);
      g_run_dir.clear();
    }
    dir_.reset();
  }
  const TempDir& dir() const { return *dir_; }

 private:
  std::unique_ptr<TempDir> dir_;
};

void Sync() { ::sync(); }

void Remove(const std::string& path) {
  UnmountUnder(path);
  std::error_code ec;
  fs::remove_all(path, ec);
}

// ---- The image --------------------------------------------------------------------------------

// Eight gzip layers in the proportions of the 17 GB image the issue is about (one layer of 59%,
// three of 9%, two of 4%, a few small ones), scaled to ~1.1 GiB unpacked: a base layer of many
// small files, one dominant layer of large files, and application layers. The test kit's files
// are half incompressible (small files wholly), so the blobs are ~60% of the tars.
ImageSpec MakeSpec(double scale) {
  auto n = [&](int v) { return std::max(1, static_cast<int>(v * scale)); };
  auto mib = [&](double v) { return static_cast<uint64_t>(v * scale * (1 << 20)); };
  using C = Compression;
  ImageSpec spec;
  spec.layers = {
      LayerSpec{.compression = C::kGzip, .small_files = n(4000), .big_files = {mib(16)}, .seed = 71},
      LayerSpec{.compression = C::kGzip, .small_files = n(1000),
                .big_files = {mib(320), mib(192), mib(96)}, .seed = 72},
      LayerSpec{.compression = C::kGzip, .small_files = n(1000), .big_files = {mib(64)}, .seed = 73},
      LayerSpec{.compression = C::kGzip, .small_files = n(1000), .big_files = {mib(64)}, .seed = 74},
      LayerSpec{.compression = C::kGzip, .small_files = n(1000), .big_files = {mib(64)}, .seed = 75},
      LayerSpec{.compression = C::kGzip, .small_files = n(400), .big_files = {mib(32)}, .seed = 76},
      LayerSpec{.compression = C::kGzip, .small_files = n(400), .big_files = {mib(32)}, .seed = 77},
      LayerSpec{.compression = C::kGzip, .small_files = n(200), .big_files = {}, .seed = 78,
                .with_whiteout = true},
  };
  return spec;
}

std::string LayoutBlob(const BuiltImage& img, const Digest& d) {
  return img.layout_dir + "/blobs/sha256/" + d.hex();
}

// ---- Measurements -----------------------------------------------------------------------------

// CPU seconds spent during a scenario: the agent, containerd, this process (the extraction
// reference, the download client) and the whole machine (busy cores x seconds, others' load
// included).
struct Cpu {
  double agent = 0, containerd = 0, bench = 0, machine = 0;
};

class CpuMeter {
 public:
  CpuMeter(pid_t agent, pid_t containerd)
      : agent_(agent), containerd_(containerd), a0_(agent > 0 ? ProcessCpuSeconds(agent) : 0),
        c0_(containerd > 0 ? ProcessCpuSeconds(containerd) : 0),
        b0_(SelfAndChildrenCpuSeconds()), m0_(ReadSystemTicks()) {}
  Cpu Read() const {
    Cpu c;
    if (agent_ > 0) c.agent = ProcessCpuSeconds(agent_) - a0_;
    if (containerd_ > 0) c.containerd = ProcessCpuSeconds(containerd_) - c0_;
    c.bench = SelfAndChildrenCpuSeconds() - b0_;
    c.machine = TicksToSeconds(ReadSystemTicks().busy - m0_.busy);
    return c;
  }

 private:
  pid_t agent_, containerd_;
  double a0_, c0_, b0_;
  SystemTicks m0_;
};

struct Measured {
  double seconds = 0;
  Cpu cpu;
  std::string note;  // what the pull did (layers prepared, bytes through the shim)
};

struct Setting {
  double mbps = 0;  // 0: no cap
  std::string Name() const { return mbps > 0 ? Fmt("%g Mbit/s", mbps) : "network-fast"; }
};

struct World {
  const BuiltImage& image;
  CountingProxy& upstream;
  std::chrono::seconds pull_timeout;
  unsigned workers;  // extraction reference: layers at a time
};

std::unique_ptr<Agent> StartAgent(const World& w, const std::string& cache,
                                  std::vector<std::string> extra) {
  AgentOptions opts;
  opts.cache_dir = cache;
  opts.upstreams = {"gcr.io=" + w.upstream.Url()};
  opts.extra_args = {"--unmapped", "error", "--cache-budget", "0"};
  opts.extra_args.insert(opts.extra_args.end(), extra.begin(), extra.end());
  return Must(Agent::Start(opts), "start shoal-agent");
}

uint16_t PortOf(const Agent& agent) {
  std::string hp = agent.HostPort();
  return static_cast<uint16_t>(std::stoi(hp.substr(hp.rfind(':') + 1)));
}

// Every blob of the image through a cold agent's shim, as a runtime pulls: the manifest, then
// the config and the layers, kDownloads at a time, bodies discarded. Leaves the blobs in
// `cache` for the extraction reference.
Measured DownloadOnly(const World& w, const std::string& cache) {
  auto agent = StartAgent(w, cache, {});
  const uint16_t port = PortOf(*agent);
  const std::string base = std::string("/v2/") + kRepository;
  std::vector<std::pair<Digest, uint64_t>> blobs;
  blobs.emplace_back(w.image.config_digest, 0);
  for (size_t i = 0; i < w.image.layer_digests.size(); ++i) {
    blobs.emplace_back(w.image.layer_digests[i], w.image.layer_sizes[i]);
  }
  w.upstream.Reset();
  Sync();
  CpuMeter meter(agent->pid(), -1);
  const auto t0 = Clock::now();
  BlobGet manifest = GetBlob(port, base + "/manifests/" + kTag + "?ns=gcr.io", 0);
  if (!manifest.error.empty()) throw BenchError("download: manifest: " + manifest.error);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::string error;  // GUARDED_BY(mu)
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kDownloads; ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < blobs.size();) {
        BlobGet got = GetBlob(port, base + "/blobs/" + blobs[i].first.str() + "?ns=gcr.io",
                              blobs[i].second);
        if (!got.error.empty()) {
          std::lock_guard<std::mutex> lock(mu);
          error = "download " + blobs[i].first.str() + ": " + got.error;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  Measured m;
  m.seconds = Seconds(Clock::now() - t0);
  m.cpu = meter.Read();
  if (!error.empty()) throw BenchError(error);
  if (w.upstream.BlobBytes() != w.image.total_blob_bytes) {
    throw BenchError(Fmt("download: the upstream served %llu blob bytes, the image has %llu",
                         static_cast<unsigned long long>(w.upstream.BlobBytes()),
                         static_cast<unsigned long long>(w.image.total_blob_bytes)));
  }
  return m;
}

// The layers extracted from the agent's cache files the way the snapshotter extracts them
// (snapshotter/layer_prep.cc: one directory per layer, overlay whiteouts, blob digest and diff
// ID checked), `workers` layers at a time in image order, into `root`.
Measured ExtractOnly(const World& w, const std::string& cache, const std::string& root) {
  const auto& img = w.image;
  std::vector<std::string> paths;
  for (const Digest& d : img.layer_digests) {
    std::string p = cache + "/blobs/sha256/" + d.hex().substr(0, 2) + "/" + d.hex();
    if (!fs::exists(p)) throw BenchError("extract: the agent's cache has no " + p);
    paths.push_back(p);
  }
  Remove(root);
  fs::create_directories(root);
  Sync();
  CpuMeter meter(-1, -1);
  const auto t0 = Clock::now();
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::string error;  // GUARDED_BY(mu)
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < w.workers; ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < paths.size();) {
        auto fail = [&](const std::string& what) {
          std::lock_guard<std::mutex> lock(mu);
          error = "extract " + paths[i] + ": " + what;
        };
        auto src = extract::OpenFileSource(paths[i]);
        if (!src) {
          fail(src.error().ToString());
          continue;
        }
        extract::ExtractOptions opts;
        opts.expected_digest = img.layer_digests[i];
        opts.expected_diff_id = img.diff_ids[i];
        opts.whiteouts = extract::WhiteoutMode::kOverlay;
        auto stats = extract::ExtractLayer(*src.value(), root + "/" + std::to_string(i), opts);
        if (!stats) fail(stats.error().ToString());
      }
    });
  }
  for (auto& t : threads) t.join();
  Measured m;
  m.seconds = Seconds(Clock::now() - t0);
  m.cpu = meter.Read();
  if (!error.empty()) throw BenchError(error);
  return m;
}

// One cold CRI PullImage: a fresh agent and a fresh containerd (CRI plugin on, gcr.io mirrored
// to the agent's shim by `shoalctl config containerd`'s hosts.toml), with snapshotter "shoal"
// (the agent's, as proxy plugin, snapshot annotations on) or containerd's own "overlayfs".
Measured CriPull(const World& w, bool shoal) {
  TempDir dir(shoal ? "shoal-pull" : "overlayfs-pull");
  // Destroyed after containerd and the agent, before dir: a mount containerd left (killed
  // mid-unpack) must go before the files do.
  struct Unmounter {
    std::string path;
    ~Unmounter() { UnmountUnder(path); }
  } unmounter{dir.path()};
  const std::string socket = dir.Sub("snap.sock");
  std::vector<std::string> extra;
  if (shoal) extra = {"--snapshotter-socket", socket};
  auto agent = StartAgent(w, dir.Sub("cache"), extra);
  const std::string hosts = dir.Sub("certs.d");
  Must(Shoalctl({"config", "containerd", "--agent", agent->HostPort(), "--registry", "gcr.io",
                 "-o", hosts}),
       "shoalctl config containerd");
  std::string config = shoal ? Containerd::ProxySnapshotterConfig("shoal", socket) +
                                   Containerd::CriImageConfig("shoal", hosts)
                             : Containerd::CriImageConfig("overlayfs", hosts);
  auto containerd = Must(Containerd::Start(config, /*cri=*/true), "start containerd");
  w.upstream.Reset();
  Sync();
  CpuMeter meter(agent->pid(), containerd->Pid());
  const auto t0 = Clock::now();
  auto pulled = CriPullImage(containerd->Socket(), std::string("gcr.io/") + kRepository + ":" + kTag,
                             w.pull_timeout);
  Measured m;
  m.seconds = Seconds(Clock::now() - t0);
  m.cpu = meter.Read();
  if (!pulled) {
    throw BenchError(std::string(shoal ? "shoal" : "overlayfs") + " pull: " +
                     pulled.error().ToString() + "\nagent:\n" + agent->LogTail() +
                     "\ncontainerd:\n" + containerd->LogTail());
  }
  if (pulled.value() != w.image.config_digest.str()) {
    throw BenchError("CRI PullImage answered " + pulled.value() + ", expected " +
                     w.image.config_digest.str());
  }
  const double shim_bytes = agent->Metric("shoal_shim_blob_bytes_total");
  uint64_t layer_bytes = 0;
  for (uint64_t s : w.image.layer_sizes) layer_bytes += s;
  if (shoal) {
    const double prepared =
        agent->Metric("shoal_snapshotter_layers_total", {{"result", "prepared"}});
    const double fallbacks =
        agent->Metric("shoal_snapshotter_layers_total", {{"result", "fallback"}});
    m.note = Fmt("%.0f/%zu layers prepared by shoal, %.0f left to containerd", prepared,
                 w.image.layer_digests.size(), fallbacks);
  } else {
    m.note = Fmt("containerd took %.0f MiB of layers from the shim (the image has %.0f)",
                 shim_bytes / (1 << 20), static_cast<double>(layer_bytes) / (1 << 20));
  }
  if (w.upstream.BlobBytes() < w.image.total_blob_bytes) {
    throw BenchError(Fmt("%s pull: the upstream served only %llu of %llu blob bytes",
                         shoal ? "shoal" : "overlayfs",
                         static_cast<unsigned long long>(w.upstream.BlobBytes()),
                         static_cast<unsigned long long>(w.image.total_blob_bytes)));
  }
  // containerd first (it holds the proxy plugin's connection), then the agent, then the files.
  containerd.reset();
  agent.reset();
  return m;
}

struct Round {
  Measured download, extract, shoal, overlayfs;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A column of the rounds: f(round) for each.
template <typename F>
double MedianOf(const std::vector<Round>& rounds, F f) {
  std::vector<double> v;
  for (const Round& r : rounds) v.push_back(f(r));
  return Median(v);
}

std::string CpuText(const Cpu& c) {
  return Fmt("agent %.1f, containerd %.1f, bench %.1f, machine %.1f", c.agent, c.containerd,
             c.bench, c.machine);
}

void PrintRound(int r, const Round& x) {
  std::printf("  round %d: download %.2fs, extract %.2fs, shoal %.2fs, overlayfs %.2fs; "
              "shoal / max(d,e) %.2fx, overlayfs / shoal %.2fx\n",
              r, x.download.seconds, x.extract.seconds, x.shoal.seconds, x.overlayfs.seconds,
              x.shoal.seconds / std::max(x.download.seconds, x.extract.seconds),
              x.overlayfs.seconds / x.shoal.seconds);
  std::printf("    cpu-s  download (%s)\n", CpuText(x.download.cpu).c_str());
  std::printf("    cpu-s  extract  (%s)\n", CpuText(x.extract.cpu).c_str());
  std::printf("    cpu-s  shoal    (%s): %s\n", CpuText(x.shoal.cpu).c_str(),
              x.shoal.note.c_str());
  std::printf("    cpu-s  overlayfs(%s): %s\n", CpuText(x.overlayfs.cpu).c_str(),
              x.overlayfs.note.c_str());
  std::fflush(stdout);
}

// The table of one setting: medians over the rounds, ratios of the medians.
void PrintTable(const Setting& s, const std::vector<Round>& rounds, double packed_gib) {
  const double dl = MedianOf(rounds, [](const Round& r) { return r.download.seconds; });
  const double ex = MedianOf(rounds, [](const Round& r) { return r.extract.seconds; });
  const double sh = MedianOf(rounds, [](const Round& r) { return r.shoal.seconds; });
  const double ov = MedianOf(rounds, [](const Round& r) { return r.overlayfs.seconds; });
  const double larger = std::max(dl, ex);
  auto cpu = [&](auto member) {
    return MedianOf(rounds, [&](const Round& r) { return (r.*member).cpu.agent +
                                                         (r.*member).cpu.containerd +
                                                         (r.*member).cpu.bench; });
  };
  std::printf("\nupstream %s, median of %zu rounds%-10s %8s %12s %10s\n", s.Name().c_str(),
              rounds.size(), "", "seconds", "vs max(d,e)", "cpu-s");
  std::printf("%-54s %8.2f %11.2fx %10.1f   (%.0f Mbit/s)\n",
              "download only (cold agent's shim, 3 blobs at a time)", dl, dl / larger,
              cpu(&Round::download), packed_gib * 8 * 1.073741824 * 1000 / dl);
  std::printf("%-54s %8.2f %11.2fx %10.1f\n", "parallel extraction only (cached blobs)", ex,
              ex / larger, cpu(&Round::extract));
  std::printf("%-54s %8.2f %11.2fx %10.1f   goal <= 1.10x: %s\n",
              "shoal snapshotter: CRI PullImage", sh, sh / larger, cpu(&Round::shoal),
              sh / larger <= 1.10 ? "met" : "missed");
  std::printf("%-54s %8.2f %11.2fx %10.1f\n", "containerd overlayfs via the shim: CRI PullImage",
              ov, ov / larger, cpu(&Round::overlayfs));
  // Download and extraction share the cores: when their CPU together needs longer than either
  // alone, no overlap of the two can beat that time on this machine.
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  const double cpu_floor = (cpu(&Round::download) + cpu(&Round::extract)) / cores;
  std::printf("%-54s %8.2f %11.2fx %10s   (download + extraction cpu-s / %.0f cores)\n",
              "CPU floor of this machine", cpu_floor, cpu_floor / larger, "", cores);
  std::printf("%-54s %7.2fx\n", "shoal / max(d, e, CPU floor)",
              sh / std::max(larger, cpu_floor));
  std::printf("%-54s %7.2fx%s\n", "overlayfs / shoal", ov / sh,
              s.mbps > 0 ? "" : Fmt("   goal >= 1.50x: %s", ov / sh >= 1.5 ? "met" : "missed").c_str());
  std::printf("(cpu-s: agent + containerd + this program, medians; load average now %s)\n",
              LoadAverage().c_str());
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  CLI::App app{
      "shoal-bench-snapshotter: cold CRI PullImage of a multi-layer image with shoal's containerd "
      "snapshotter vs containerd's overlayfs snapshotter through the same agent shim, next to the "
      "download alone and the parallel extraction alone, through a throttled upstream. Needs "
      "root."};
  std::string dir = "/var/tmp";
  std::vector<double> mbps = {300, 0};
  int rounds = 3;
  double scale = 1.0;
  int pull_timeout_s = 900;
  app.add_option("--dir", dir,
                 "Where the run's temp dir goes (image, registry, caches, containerd roots, "
                 "snapshots: ~4x the unpacked image at peak); not tmpfs")
      ->capture_default_str();
  app.add_option("--upstream-mbps", mbps,
                 "Upstream link rates to measure, Mbit/s over all connections together "
                 "(comma-separated); 0 = no cap (network-fast)")
      ->delimiter(',')
      ->check(CLI::Range(0.0, 100000.0))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "Rounds per rate; medians are reported")
      ->check(CLI::Range(1, 20))
      ->capture_default_str();
  app.add_option("--scale", scale,
                 "Multiplies every file count and size of the image (1 = ~1.1 GiB unpacked)")
      ->check(CLI::Range(0.01, 20.0))
      ->capture_default_str();
  app.add_option("--pull-timeout-s", pull_timeout_s,
                 "Longest one PullImage may take before the run fails")
      ->check(CLI::Range(10, 7200))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (::geteuid() != 0) throw BenchError("needs root (containerd, overlay mounts)");
  for (const char* tool : {"containerd", "docker-registry", "skopeo"}) {
    if (!RunCommand({"sh", "-c", std::string("command -v ") + tool}, std::chrono::seconds(10))) {
      throw BenchError(std::string(tool) + " is not installed");
    }
  }
  std::printf("machine: %s, load average %s\n", MachineSummary().c_str(), LoadAverage().c_str());

  RunDir run(dir);
  std::printf("building the image in %s ...\n", run.dir().path().c_str());
  std::fflush(stdout);
  auto t = Clock::now();
  BuiltImage img = Must(BuildImage(MakeSpec(scale), run.dir().Sub("layout"), kTag), "build image");
  uint64_t packed = 0;
  for (uint64_t s : img.layer_sizes) packed += s;
  // The unpacked size: the tars' lengths (what containerd's unpack and shoal's write).
  uint64_t unpacked = 0;
  {
    for (size_t i = 0; i < img.layer_digests.size(); ++i) {
      auto src = Must(extract::OpenFileSource(LayoutBlob(img, img.layer_digests[i])), "open");
      std::string out = run.dir().Sub("sizing");
      auto stats = Must(extract::ExtractLayer(*src, out), "sizing extraction");
      unpacked += stats.data_bytes;
      Remove(out);
    }
  }
  const double packed_gib = static_cast<double>(packed) / (1 << 30);
  const double unpacked_gib = static_cast<double>(unpacked) / (1 << 30);
  std::printf("image: %zu gzip layers, %.2f GiB packed, %.2f GiB of file data unpacked "
              "(%.2fx); built in %.1fs\n",
              img.layer_digests.size(), packed_gib, unpacked_gib, unpacked_gib / packed_gib,
              Seconds(Clock::now() - t));
  std::printf("  layers packed, MiB:");
  for (uint64_t s : img.layer_sizes) std::printf(" %.0f", static_cast<double>(s) / (1 << 20));
  std::printf("\n");
  std::fflush(stdout);

  auto up = Must(CountedUpstream::Start(), "start docker-registry");
  MustOk(PushImage(*up.registry, img.layout_dir, kTag, kRepository), "push");
  World w{img, *up.proxy, std::chrono::seconds(pull_timeout_s), 3};

  struct Done {
    Setting setting;
    std::vector<Round> rounds;
  };
  std::vector<Done> done;
  for (double rate : mbps) {
    Setting s{rate};
    up.proxy->SetRateLimit(static_cast<uint64_t>(rate * 1e6 / 8));
    std::printf("\nupstream %s: %d rounds (load average %s)\n", s.Name().c_str(), rounds,
                LoadAverage().c_str());
    std::fflush(stdout);
    Done d{s, {}};
    for (int r = 1; r <= rounds; ++r) {
      Round x;
      {
        TempDir scratch("reference");
        x.download = DownloadOnly(w, scratch.Sub("cache"));
        x.extract = ExtractOnly(w, scratch.Sub("cache"), scratch.Sub("extracted"));
      }
      // The two pulls take turns going first, so that neither always meets the other's
      // writeback.
      if (r % 2 == 1) {
        x.shoal = CriPull(w, true);
        x.overlayfs = CriPull(w, false);
      } else {
        x.overlayfs = CriPull(w, false);
        x.shoal = CriPull(w, true);
      }
      PrintRound(r, x);
      d.rounds.push_back(x);
    }
    PrintTable(s, d.rounds, packed_gib);
    done.push_back(std::move(d));
  }
  std::printf("\nimage: %zu gzip layers, %.2f GiB packed, %.2f GiB unpacked\n",
              img.layer_digests.size(), packed_gib, unpacked_gib);
  for (const Done& d : done) PrintTable(d.setting, d.rounds, packed_gib);
  return 0;
}

}  // namespace
}  // namespace shoal::testkit

int main(int argc, char** argv) {
  // Ctrl-C must not leave daemons, mounts or GiBs in --dir behind: the signals are blocked in
  // every thread (children get a clean mask from posix_spawn) and taken by a thread of their own,
  // which kills the children (so the step in progress fails and main unwinds through the
  // destructors), and after 3 s cleans up itself.
  signal(SIGPIPE, SIG_IGN);
  shoal::testkit::HandleInterruptsOnThread([](int sig) {
    std::fprintf(stderr, "\nshoal-bench-snapshotter: interrupted (signal %d), cleaning up\n", sig);
    for (int i = 0; i < 30; ++i) {
      shoal::testkit::KillAllChildren();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::string run_dir;
    {
      std::lock_guard<std::mutex> lock(shoal::testkit::g_run_dir_mu);
      run_dir = shoal::testkit::g_run_dir;
    }
    if (!run_dir.empty()) {
      shoal::testkit::UnmountUnder(run_dir);
      std::error_code ec;
      std::filesystem::remove_all(run_dir, ec);
    }
    std::fflush(stdout);
    _exit(shoal::testkit::kInterruptedExit);
  });
  int rc = 1;
  try {
    rc = shoal::testkit::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nshoal-bench-snapshotter: %s\n", e.what());
    rc = 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);
}
