// shoal-bench-extract: extracting a multi-layer image (>= 1 GiB uncompressed, many small files
// and a few large ones, gzip and zstd layers) with shoal's parallel extractor, against GNU tar
// run on each layer one after the other (`tar -xzf` / `tar --zstd -xf`), in the same run; and
// gzip decode throughput of ISA-L (shoal's decoder) against zlib; and the time from a cold
// request to the image unpacked on disk (`shoalctl extract` against a cold agent, which extracts
// while it downloads) against the download and the extraction done one after the other, with a
// real docker-registry upstream behind a throttling proxy and a real shoal-agent.
//
//   shoal-bench-extract [--dir /var/tmp] [--scale 1.0] [--rounds 2] [--ms-per-mib 40]
//                       [--only-pipeline]
//
// Each timed run starts after `sync` with the blobs in the page cache and an empty target; the
// time includes every write (to the page cache: neither side fsyncs). A program, not a test.
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "lib/extract/decompress.h"
#include "lib/extract/image.h"
#include "tests/support/agent.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"

namespace {

namespace fs = std::filesystem;
using namespace shoal;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void Fail(const std::string& what) {
  std::fprintf(stderr, "shoal-bench-extract: %s\n", what.c_str());
  std::exit(1);
}

void Sync() { ::sync(); }

void Remove(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

std::string BlobPath(const testkit::BuiltImage& img, size_t i) {
  return img.layout_dir + "/blobs/sha256/" + img.layer_digests[i].hex();
}

// GNU tar, one layer after the other, each into its own directory.
double RunTar(const testkit::BuiltImage& img, const std::vector<testkit::Compression>& kinds,
              const std::string& root) {
  Remove(root);
  fs::create_directories(root);
  Sync();
  auto t = Clock::now();
  for (size_t i = 0; i < img.layer_digests.size(); ++i) {
    std::string dir = root + "/" + std::to_string(i);
    fs::create_directories(dir);
    std::vector<std::string> argv = {"tar"};
    if (kinds[i] == testkit::Compression::kGzip) argv.push_back("-xzf");
    if (kinds[i] == testkit::Compression::kZstd) {
      argv.push_back("--zstd");
      argv.push_back("-xf");
    }
    if (kinds[i] == testkit::Compression::kNone) argv.push_back("-xf");
    argv.push_back(BlobPath(img, i));
    argv.push_back("-C");
    argv.push_back(dir);
    auto out = testkit::RunCommand(argv, std::chrono::seconds(600));
    if (!out) Fail(out.error().ToString());
  }
  return Since(t);
}

double RunShoal(const testkit::BuiltImage& img, const std::string& root, unsigned parallelism) {
  Remove(root);
  Sync();
  std::vector<extract::LayerInput> inputs;
  for (size_t i = 0; i < img.layer_digests.size(); ++i) {
    std::string path = BlobPath(img, i);
    inputs.push_back({.digest = img.layer_digests[i],
                      .size_hint = img.layer_sizes[i],
                      .open = [path] { return extract::OpenFileSource(path); },
                      .verify = true});
  }
  extract::ImageExtractOptions opts;
  opts.parallelism = parallelism;
  auto t = Clock::now();
  auto r = extract::ExtractImage(root, inputs, opts);
  double secs = Since(t);
  if (!r) Fail(r.error().ToString());
  return secs;
}

std::string ReadAll(const std::string& path) {
  std::string s = testkit::ReadFile(path);
  if (s.empty()) Fail("cannot read " + path);
  return s;
}

// Decoded bytes per second of the whole gzip stream through shoal's decoder (ISA-L).
double IsalRate(const std::string& gz, uint64_t& out_bytes) {
  auto src = extract::MemorySource({reinterpret_cast<const std::byte*>(gz.data()), gz.size()});
  auto t = Clock::now();
  auto dec = extract::OpenDecoder(*src);
  if (!dec) Fail(dec.error().ToString());
  std::vector<std::byte> buf(1 << 20);
  out_bytes = 0;
  for (;;) {
    auto n = dec.value()->Read(buf);
    if (!n) Fail(n.error().ToString());
    if (n.value() == 0) break;
    out_bytes += n.value();
  }
  return static_cast<double>(out_bytes) / Since(t);
}

// The same with zlib's inflate (gzip wrapper, every member).
double ZlibRate(const std::string& gz, uint64_t& out_bytes) {
  auto t = Clock::now();
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) Fail("inflateInit2");
  std::vector<unsigned char> buf(1 << 20);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  z.avail_in = static_cast<uInt>(gz.size());
  out_bytes = 0;
  for (;;) {
    z.next_out = buf.data();
    z.avail_out = static_cast<uInt>(buf.size());
    int rc = inflate(&z, Z_NO_FLUSH);
    out_bytes += buf.size() - z.avail_out;
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0) break;
      inflateReset(&z);
      continue;
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) Fail("zlib inflate failed");
  }
  inflateEnd(&z);
  return static_cast<double>(out_bytes) / Since(t);
}

// Runs argv to completion and returns its wall time; exits on failure.
double Timed(std::vector<std::string> argv) {
  auto t = Clock::now();
  auto out = testkit::RunCommand(std::move(argv), std::chrono::seconds(1800));
  if (!out) Fail(out.error().ToString());
  return Since(t);
}

struct PipelineRound {
  double download = 0;   // every layer through a cold agent, 3 at a time, to /dev/null
  double extract = 0;    // shoalctl extract from the now warm agent (the cache)
  double pipelined = 0;  // shoalctl extract from another cold agent: extracting while downloading
};

// One round of the cold-request-to-unpacked comparison: two fresh agents (empty caches) in
// front of the throttled upstream.
PipelineRound RunPipeline(const testkit::BuiltImage& img, const testkit::CountingProxy& upstream,
                          const std::string& root, const std::string& ref,
                          const std::string& repository) {
  auto agent_for = [&](const std::string& cache) {
    Remove(cache);
    testkit::AgentOptions opts;
    opts.cache_dir = cache;
    opts.upstreams = {"gcr.io=" + upstream.Url()};
    opts.extra_args = {"--unmapped", "error", "--cache-budget", "0"};
    auto agent = testkit::Agent::Start(opts);
    if (!agent) Fail(agent.error().ToString());
    return std::move(agent.value());
  };
  PipelineRound round;
  {
    auto agent = agent_for(root + "/cache-a");
    // The manifest first (not timed), then the layers as a runtime fetches them.
    Timed({SHOAL_CTL_BIN, "pull", "--agent", agent->Url(), ref});
    Remove(root + "/cache-a");
    agent = agent_for(root + "/cache-a");
    std::string urls;
    for (const Digest& d : img.layer_digests) {
      urls += agent->Url() + "/v2/" + repository + "/blobs/" + d.str() + "?ns=gcr.io\n";
    }
    Sync();
    round.download = Timed({"sh", "-c",
                            "printf '" + urls + "' | xargs -P 3 -n 1 curl -sSf -o /dev/null"});
    Remove(root + "/unpacked");
    Sync();
    round.extract = Timed({SHOAL_CTL_BIN, "extract", "--agent", agent->Url(), "--downloads", "3",
                           ref, root + "/unpacked"});
  }
  Remove(root + "/cache-a");
  Remove(root + "/unpacked");
  auto agent = agent_for(root + "/cache-b");
  Sync();
  round.pipelined = Timed({SHOAL_CTL_BIN, "extract", "--agent", agent->Url(), "--downloads", "3",
                           ref, root + "/unpacked"});
  Remove(root + "/unpacked");
  Remove(root + "/cache-b");
  return round;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shoal-bench-extract: shoal's parallel layer extraction vs GNU tar per layer"};
  std::string dir = "/var/tmp";
  double scale = 1.0;
  int rounds = 2;
  app.add_option("--dir", dir, "Where to build the image and extract (needs ~4x the image)")
      ->capture_default_str();
  app.add_option("--scale", scale, "Multiplies every file count and size")->capture_default_str();
  app.add_option("--rounds", rounds, "Timed runs of each side (the best is reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  int ms_per_mib = 40;
  bool only_pipeline = false;
  app.add_option("--ms-per-mib", ms_per_mib,
                 "Upstream throttle for the cold-request scenario: delay per MiB on each upstream "
                 "connection (the agent opens several)")
      ->capture_default_str();
  app.add_flag("--only-pipeline", only_pipeline,
               "Run only the cold-request-to-unpacked scenario");
  CLI11_PARSE(app, argc, argv);

  setenv("TMPDIR", dir.c_str(), 1);
  testkit::TempDir work("shoal-bench-extract");
  auto n = [&](double v) { return static_cast<int>(v * scale); };
  auto mib = [&](double v) { return static_cast<uint64_t>(v * scale) << 20; };
  using testkit::Compression;
  using testkit::LayerSpec;
  // A base-image-like bottom layer, then application layers of decreasing size.
  testkit::ImageSpec spec;
  spec.layers = {
      LayerSpec{.compression = Compression::kGzip, .small_files = n(5000), .big_files = {mib(64), mib(64)}, .seed = 1},
      LayerSpec{.compression = Compression::kGzip, .small_files = n(3000), .big_files = {mib(128)}, .seed = 2},
      LayerSpec{.compression = Compression::kZstd, .small_files = n(3000), .big_files = {mib(96), mib(32)}, .seed = 3},
      LayerSpec{.compression = Compression::kGzip, .small_files = n(2000), .big_files = {mib(100)}, .seed = 4},
      LayerSpec{.compression = Compression::kZstd, .small_files = n(2000), .big_files = {mib(64)}, .seed = 5},
      LayerSpec{.compression = Compression::kGzip, .small_files = n(1000), .big_files = {mib(48)}, .seed = 6},
  };
  std::vector<Compression> kinds;
  for (const auto& l : spec.layers) kinds.push_back(l.compression);

  std::printf("building the image in %s ...\n", work.path().c_str());
  std::fflush(stdout);
  auto t = Clock::now();
  auto img = testkit::BuildImage(spec, work.Sub("layout"), "bench");
  if (!img) Fail(img.error().ToString());
  std::printf("built in %.1fs\n", Since(t));
  uint64_t blob_bytes = 0;
  for (uint64_t s : img.value().layer_sizes) blob_bytes += s;

  if (!only_pipeline) {

  // Uncompressed size and file count, from one untimed sizing extraction (it goes first, on a
  // quiet disk with a cold page cache for the output, so it is not comparable with the rounds).
  double sizing = RunShoal(img.value(), work.Sub("shoal"), 1);
  uint64_t tar_bytes = 0, files = 0;
  for (const auto& e : fs::recursive_directory_iterator(work.Sub("shoal"))) {
    std::error_code ec;
    if (fs::is_regular_file(e.symlink_status(ec))) {
      tar_bytes += e.file_size();
      ++files;
    }
  }
  std::printf("image: %zu layers (4 gzip, 2 zstd), %.2f GiB of blobs, %.2f GiB in %llu files\n",
              spec.layers.size(), static_cast<double>(blob_bytes) / (1 << 30),
              static_cast<double>(tar_bytes) / (1 << 30), static_cast<unsigned long long>(files));
  std::printf("sizing run (one layer at a time, untimed): %.2fs\n", sizing);
  std::fflush(stdout);

  // Every figure below is the best of the timed rounds, each side run in the same round.
  double best_tar = 1e9, best_par = 1e9, best_seq = 1e9;
  for (int r = 0; r < rounds; ++r) {
    double a = RunTar(img.value(), kinds, work.Sub("tar"));
    Remove(work.Sub("tar"));
    double b = RunShoal(img.value(), work.Sub("shoal"), 0);
    double c = RunShoal(img.value(), work.Sub("shoal"), 1);
    std::printf("round %d: tar per layer %.2fs, shoal parallel %.2fs, shoal one layer at a time %.2fs\n",
                r + 1, a, b, c);
    std::fflush(stdout);
    best_tar = std::min(best_tar, a);
    best_par = std::min(best_par, b);
    best_seq = std::min(best_seq, c);
  }
  Remove(work.Sub("shoal"));
  const double gib = static_cast<double>(tar_bytes) / (1 << 30);
  std::printf("\n%-44s %8s %10s %8s\n", "extraction (best of rounds)", "seconds", "GiB/s", "vs tar");
  std::printf("%-44s %8.2f %10.2f %8s\n", "tar -xzf / tar --zstd -xf, layer after layer", best_tar,
              gib / best_tar, "1.00x");
  std::printf("%-44s %8.2f %10.2f %7.2fx\n", "shoal, one layer at a time", best_seq,
              gib / best_seq, best_tar / best_seq);
  std::printf("%-44s %8.2f %10.2f %7.2fx\n", "shoal, layers in parallel", best_par, gib / best_par,
              best_tar / best_par);

  // gzip decode throughput, in memory: the largest gzip layer of the image (its content is half
  // incompressible, half zeros) and a tar of real system files (/usr: headers, docs, shared
  // libraries) compressed by gzip -6, the default level of docker and skopeo.
  size_t largest = 0;
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i] == Compression::kGzip &&
        img.value().layer_sizes[i] > img.value().layer_sizes[largest]) {
      largest = i;
    }
  }
  const std::string real = work.Sub("usr.tar.gz");
  auto made = testkit::RunCommand(
      {"sh", "-c",
       "tar -cf - -C /usr include share/doc lib/x86_64-linux-gnu 2>/dev/null | head -c 200000000 "
       "| gzip -6 > " + real});
  if (!made) Fail(made.error().ToString());
  std::printf("\n%-44s %10s %10s %8s\n", "gzip decode (one core, in memory)", "zlib MiB/s",
              "ISA-L MiB/s", "ratio");
  for (const auto& [name, path] :
       std::vector<std::pair<std::string, std::string>>{
           {"generated layer (random + zero blocks)", BlobPath(img.value(), largest)},
           {"/usr files, gzip -6", real}}) {
    std::string gz = ReadAll(path);
    uint64_t out_isal = 0, out_zlib = 0;
    double isal = 0, zlib = 0;
    for (int r = 0; r < 3; ++r) {
      isal = std::max(isal, IsalRate(gz, out_isal));
      zlib = std::max(zlib, ZlibRate(gz, out_zlib));
    }
    if (out_isal != out_zlib) Fail("ISA-L and zlib decoded different sizes");
    std::printf("%-44s %10.0f %10.0f %7.2fx   (%.0f MiB -> %.0f MiB)\n", name.c_str(),
                zlib / (1 << 20), isal / (1 << 20), isal / zlib,
                static_cast<double>(gz.size()) / (1 << 20),
                static_cast<double>(out_isal) / (1 << 20));
  }
  std::printf("(zlib %s)\n", zlibVersion());
  }

  // Cold request to unpacked: a real docker-registry upstream behind a throttling proxy.
  {
    auto reg = testkit::Registry::Start();
    if (!reg) Fail(reg.error().ToString());
    const std::string repository = "gcr.io/bench/img";
    Status pushed = testkit::PushImage(*reg.value(), work.Sub("layout"), "bench", "bench/img");
    if (!pushed) Fail(pushed.error().ToString());
    auto proxy = testkit::CountingProxy::Start(reg.value()->HostPort());
    if (!proxy) Fail(proxy.error().ToString());
    proxy.value()->SetDelayPerMiB(std::chrono::milliseconds(ms_per_mib));
    const std::string ref = repository + ":bench";
    std::printf("\ncold request to unpacked (%.2f GiB of blobs; upstream throttled to %d ms per MiB "
                "per connection; 3 layers at a time)\n",
                static_cast<double>(blob_bytes) / (1 << 30), ms_per_mib);
    std::fflush(stdout);
    PipelineRound best{1e9, 1e9, 1e9};
    for (int r = 0; r < rounds; ++r) {
      PipelineRound one = RunPipeline(img.value(), *proxy.value(), work.Sub("pipe"), ref, repository);
      std::printf("round %d: download %.2fs, extract from cache %.2fs, extract while downloading "
                  "%.2fs\n",
                  r + 1, one.download, one.extract, one.pipelined);
      std::fflush(stdout);
      best.download = std::min(best.download, one.download);
      best.extract = std::min(best.extract, one.extract);
      best.pipelined = std::min(best.pipelined, one.pipelined);
    }
    const double sum = best.download + best.extract;
    const double larger = std::max(best.download, best.extract);
    std::printf("\n%-52s %8s %10s\n", "cold request to unpacked (best of rounds)", "seconds",
                "vs larger");
    std::printf("%-52s %8.2f %9.2fx\n", "download (cold agent, curl x3)", best.download,
                best.download / larger);
    std::printf("%-52s %8.2f %9.2fx\n", "extract (shoalctl extract, warm agent)", best.extract,
                best.extract / larger);
    std::printf("%-52s %8.2f %9.2fx\n", "download, then extract (sum)", sum, sum / larger);
    std::printf("%-52s %8.2f %9.2fx\n", "shoal: extract while downloading (cold agent)",
                best.pipelined, best.pipelined / larger);
  }
  return 0;
}
