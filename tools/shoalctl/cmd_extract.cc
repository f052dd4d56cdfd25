// `shoalctl extract IMAGE DIR`: pulls an image through the node's agent and extracts its layers
// into DIR in overlay2's layout (lib/extract/image.h). Each layer streams into a temp file and is
// extracted while it downloads (a growing-file source); the layer is committed only once its
// bytes hash to its digest.
#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "lib/core/sha256.h"
#include "lib/extract/image.h"
#include "lib/http/client.h"
#include "lib/oci/manifest.h"
#include "lib/oci/reference.h"
#include "tools/shoalctl/agent_client.h"
#include "tools/shoalctl/commands.h"
#include "tools/shoalctl/human.h"

namespace shoal::ctl {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using asio::awaitable;

struct ExtractFlags {
  std::string image;
  std::string dir;
  std::string agent = "http://127.0.0.1:5000";
  std::string platform = "linux/amd64";
  unsigned jobs = 0;
  unsigned downloads = 3;
  bool json = false;
  bool user_whiteouts = false;
};



// Download progress shared between the network thread (writer) and the extraction workers
// (readers waiting for a layer's prefix).
struct Downloads {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> have;                // GUARDED_BY(mu): bytes written per layer
  std::vector<std::optional<Error>> failed;  // GUARDED_BY(mu)

  Result<uint64_t> Wait(size_t i, uint64_t want) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return have[i] >= want || failed[i].has_value(); });
    if (have[i] >= want) return have[i];
    return *failed[i];
  }
  void Add(size_t i, uint64_t n) {
    {
      std::lock_guard lk(mu);
      have[i] += n;
    }
    cv.notify_all();
  }
  void Fail(size_t i, Error e) {
    {
      std::lock_guard lk(mu);
      if (!failed[i]) failed[i] = std::move(e);
    }
    cv.notify_all();
  }
};

// The agent's shim, as a runtime uses it (registry in ?ns=, like shoalctl pull).
class ShimFetcher {
 public:
  ShimFetcher(asio::io_context& ioc, http::Url agent, oci::ImageRef image)
      : image_(std::move(image)), agent_(ioc, std::move(agent)) {}

  // Resolves the image to one platform's manifest.
  awaitable<Result<oci::Manifest>> Resolve(const std::string& platform, Digest& top_digest) {
    auto resolved = co_await agent_.Resolve(image_, platform);
    if (!resolved) co_return resolved.error();
    top_digest = resolved.value().digest;
    co_return resolved.value().manifest;
  }

  // Streams blob `d` into `fd`, reporting each piece to downloads.Add(i, n). The digest is not
  // checked here: the extractor hashes the same bytes and commits the layer only if they match.
  awaitable<Status> Download(const oci::Descriptor& d, int fd, size_t i, Downloads& downloads) {
    uint64_t off = 0;
    const BlobSink sink = [&](std::string_view piece) -> Status {
      const char* p = piece.data();
      size_t left = piece.size();
      while (left > 0) {
        ssize_t w = ::pwrite(fd, p, left, static_cast<off_t>(off));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
          return MakeError(ErrorCode::kIo,
                           "write blob " + d.digest.str() + ": " + std::strerror(errno));
        }
        p += w;
        off += static_cast<uint64_t>(w);
        left -= static_cast<size_t>(w);
        downloads.Add(i, static_cast<uint64_t>(w));
      }
      return Ok();
    };
    auto streamed = co_await agent_.StreamBlob(image_, d, sink, /*verify_digest=*/false);
    if (!streamed) co_return streamed.error();
    co_return Ok();
  }

 private:
  oci::ImageRef image_;
  AgentClient agent_;
};

int RunExtract(const ExtractFlags& flags) {
  auto agent = http::Url::Parse(flags.agent);
  if (!agent) {
    std::cerr << "shoalctl: --agent: " << agent.error().message << "\n";
    return 2;
  }
  auto image = oci::ParseImageRef(flags.image);
  if (!image) {
    std::cerr << "shoalctl: " << flags.image << ": " << image.error().message << "\n";
    return 2;
  }
  const bool tty = ::isatty(STDERR_FILENO) && !flags.json;
  const auto start = std::chrono::steady_clock::now();
  auto fail = [&](const Error& e) {
    if (tty) std::fprintf(stderr, "\r\033[K");
    if (flags.json) {
      nlohmann::json out = {{"image", flags.image}, {"ok", false}, {"error", e.ToString()}};
      std::cout << out.dump(2) << "\n";
    } else {
      std::cerr << "shoalctl extract " << flags.image << ": " << e.ToString() << "\n";
    }
    return 1;
  };

  asio::io_context ioc;
  ShimFetcher fetcher(ioc, agent.value(), image.value());
  Digest top_digest = Digest::FromSha256Hex(std::string(64, '0'));
  Result<oci::Manifest> manifest = MakeError(ErrorCode::kInternal, "not run");
  asio::co_spawn(
      ioc,
      [&]() -> awaitable<void> { manifest = co_await fetcher.Resolve(flags.platform, top_digest); },
      asio::detached);
  ioc.run();
  if (!manifest) return fail(manifest.error());
  const std::vector<oci::Descriptor> layers = manifest.value().layers;

  std::error_code ec;
  fs::create_directories(flags.dir, ec);
  if (ec) return fail(MakeError(ErrorCode::kIo, "mkdir " + flags.dir + ": " + ec.message()));
  std::string tmp = flags.dir + "/.shoalctl-download-XXXXXX";
  if (::mkdtemp(tmp.data()) == nullptr) {
    return fail(MakeError(ErrorCode::kIo, "mkdtemp " + tmp + ": " + std::strerror(errno)));
  }
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } cleanup{tmp};

  // One temp file per layer, all created before extraction starts (the sources open them).
  Downloads downloads;
  downloads.have.assign(layers.size(), 0);
  downloads.failed.assign(layers.size(), std::nullopt);
  std::vector<int> fds;
  std::vector<std::string> paths;
  struct FdCloser {
    std::vector<int>& fds;
    ~FdCloser() {
      for (int fd : fds) ::close(fd);
    }
  } closer{fds};
  std::vector<extract::LayerInput> inputs;
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    paths.push_back(tmp + "/" + layers[i].digest.hex());
    int fd = ::open(paths.back().c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      return fail(MakeError(ErrorCode::kIo, "create " + paths.back() + ": " + std::strerror(errno)));
    }
    fds.push_back(fd);
    total_bytes += static_cast<uint64_t>(layers[i].size);
    extract::LayerInput in{.digest = layers[i].digest,
                           .size_hint = static_cast<uint64_t>(layers[i].size),
                           .open = nullptr,
                           .verify = true};
    const uint64_t size = static_cast<uint64_t>(layers[i].size);
    in.open = [&downloads, path = paths.back(), size, i]() {
      return extract::OpenGrowingFileSource(
          path, size, [&downloads, i](uint64_t want) { return downloads.Wait(i, want); });
    };
    inputs.push_back(std::move(in));
  }

  // Extraction runs on its own threads while the network thread downloads.
  std::atomic<int> layers_done{0};
  extract::ImageExtractOptions options;
  options.parallelism = flags.jobs;
  if (flags.user_whiteouts) options.layer.whiteouts = extract::WhiteoutMode::kUser;
  options.on_layer_done = [&](size_t, const Result<extract::LayerStats>&) { ++layers_done; };
  Result<std::vector<extract::LayerResult>> extracted =
      MakeError(ErrorCode::kInternal, "not run");
  std::thread extractor([&] { extracted = extract::ExtractImage(flags.dir, inputs, options); });

  // Downloads go largest first, the order in which ExtractImage starts layers.
  std::vector<size_t> order(layers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return layers[a].size > layers[b].size; });
  auto last_draw = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  auto draw = [&](bool force) {
    if (!tty) return;
    auto now = std::chrono::steady_clock::now();
    if (!force && now - last_draw < std::chrono::milliseconds(200)) return;
    last_draw = now;
    uint64_t have = 0;
    {
      std::lock_guard lk(downloads.mu);
      for (uint64_t h : downloads.have) have += h;
    }
    double secs = std::chrono::duration<double>(now - start).count();
    std::fprintf(stderr, "\r\033[K%s  downloaded %s / %s  %.1f MiB/s  extracted %d/%zu layers",
                 flags.image.c_str(), Human(static_cast<double>(have)).c_str(),
                 Human(static_cast<double>(total_bytes)).c_str(),
                 secs > 0 ? static_cast<double>(have) / secs / (1 << 20) : 0.0,
                 layers_done.load(), layers.size());
  };
  // --downloads workers take layers in that order, each over its own connection (like a
  // runtime's max-concurrent-downloads), so the agent fetches several blobs at once.
  size_t next = 0;
  bool stop = false;
  for (unsigned w = 0; w < std::max(1u, flags.downloads); ++w) {
    asio::co_spawn(
        ioc,
        [&]() -> awaitable<void> {
          while (!stop && next < order.size()) {
            const size_t i = order[next++];
            auto st = co_await fetcher.Download(layers[i], fds[i], i, downloads);
            if (!st) {
              // This layer and every one not started yet fail; their extraction stops.
              stop = true;
              downloads.Fail(i, st.error());
              for (; next < order.size(); ++next) downloads.Fail(order[next], st.error());
              co_return;
            }
            draw(false);
          }
        },
        asio::detached);
  }
  std::atomic<bool> extracting{true};
  std::thread ticker([&] {
    while (extracting) {
      draw(false);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  ioc.restart();
  ioc.run();
  extractor.join();
  extracting = false;
  ticker.join();
  if (tty) std::fprintf(stderr, "\r\033[K");
  if (!extracted) return fail(extracted.error());

  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string lowerdir = extract::LowerDirOption(extracted.value());
  if (flags.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto& r = extracted.value()[i];
      rows.push_back({{"digest", layers[i].digest.str()},
                      {"id", r.id},
                      {"diff", r.diff_dir},
                      {"reused", r.reused},
                      {"compression", std::string(extract::CompressionName(r.stats.compression))},
                      {"bytes", layers[i].size},
                      {"tar_bytes", r.stats.tar_bytes},
                      {"entries", r.stats.entries},
                      {"whiteouts", r.stats.whiteouts}});
    }
    nlohmann::json out = {{"image", flags.image},  {"ok", true},
                          {"digest", top_digest.str()}, {"root", flags.dir},
                          {"layers", rows},        {"lowerdir", lowerdir},
                          {"seconds", secs}};
    std::cout << out.dump(2) << "\n";
  } else {
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto& r = extracted.value()[i];
      std::printf("layer %-3zu %s  %-4s  %10s  %8llu entries  %s\n", i,
                  layers[i].digest.hex().substr(0, 12).c_str(),
                  r.reused ? "kept" : std::string(extract::CompressionName(r.stats.compression)).c_str(),
                  Human(static_cast<double>(layers[i].size)).c_str(),
                  static_cast<unsigned long long>(r.stats.entries), r.diff_dir.c_str());
    }
    std::printf("%s: %zu layers in %.2fs\nlowerdir=%s\n", flags.image.c_str(), layers.size(), secs,
                lowerdir.c_str());
  }
  return 0;
}

}  // namespace

void AddExtractCommand(CLI::App& app) {
  auto flags = std::make_shared<ExtractFlags>();
  CLI::App* cmd = app.add_subcommand(
      "extract",
      "Pull an image through this node's agent and extract its layers into DIR (overlay2 "
      "layout: DIR/<id>/diff, link, lower; DIR/l/), extracting while downloading");
  cmd->add_option("image", flags->image, "Image reference, e.g. gcr.io/proj/img:tag")->required();
  cmd->add_option("dir", flags->dir, "Target directory (created if missing)")->required();
  cmd->add_option("--agent", flags->agent, "The node agent's registry shim URL")
      ->envname("SHOAL_AGENT_URL")
      ->capture_default_str();
  cmd->add_option("--platform", flags->platform, "os/arch to choose from multi-arch images")
      ->capture_default_str();
  cmd->add_option("--jobs", flags->jobs, "Layers extracted at once (0: one per CPU core)")
      ->capture_default_str();
  cmd->add_option("--downloads", flags->downloads,
                  "Layers downloaded at once, largest first, one connection each")
      ->capture_default_str()
      ->envname("SHOAL_EXTRACT_DOWNLOADS");
  cmd->add_flag("--user-whiteouts", flags->user_whiteouts,
                "Write whiteouts in the unprivileged form (.wh.NAME files, user.overlay.opaque) "
                "even as root");
  cmd->add_flag("--json", flags->json, "Print the result as JSON");
  cmd->callback([flags] { throw CLI::RuntimeError(RunExtract(*flags)); });
}

}  // namespace shoal::ctl
