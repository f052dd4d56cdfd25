#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "tools/shoalctl/agent_client.h"
#include "tools/shoalctl/commands.h"
#include "tools/shoalctl/human.h"

namespace shoal::ctl {
namespace {

struct PullFlags {
  std::vector<std::string> images;
  std::string agent = "http://127.0.0.1:5000";
  std::string platform = "linux/amd64";
  bool json = false;
};


int RunPull(const PullFlags& flags) {
  auto agent = http::Url::Parse(flags.agent);
  if (!agent) {
    std::cerr << "shoalctl: --agent: " << agent.error().message << "\n";
    return 2;
  }
  const bool tty = ::isatty(STDERR_FILENO) && !flags.json;
  boost::asio::io_context ioc;
  AgentClient client(ioc, agent.value());
  nlohmann::json results = nlohmann::json::array();
  int failures = 0;
  for (const auto& text : flags.images) {
    auto image = oci::ParseImageRef(text);
    if (!image) {
      std::cerr << "shoalctl: " << text << ": " << image.error().message << "\n";
      ++failures;
      continue;
    }
    auto start = std::chrono::steady_clock::now();
    uint64_t done_bytes = 0;
    auto last_draw = start;
    ProgressFn progress = [&](const Digest& d, uint64_t got, uint64_t size) {
      if (!tty) return;
      auto now = std::chrono::steady_clock::now();
      if (got != size && now - last_draw < std::chrono::milliseconds(200)) return;
      last_draw = now;
      double secs = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "\r\033[K%s  %s  %s / %s  %.1f MiB/s", text.c_str(),
                   d.hex().substr(0, 12).c_str(), Human(static_cast<double>(got)).c_str(),
                   Human(static_cast<double>(size)).c_str(),
                   secs > 0 ? static_cast<double>(done_bytes + got) / secs / (1 << 20) : 0.0);
      if (got == size) done_bytes += size;
    };
    Result<PullReport> report = MakeError(ErrorCode::kInternal, "not run");
    boost::asio::co_spawn(
        ioc,
        [&]() -> boost::asio::awaitable<void> {
          report = co_await client.Pull(image.value(), flags.platform, progress);
        },
        boost::asio::detached);
    ioc.restart();
    ioc.run();
    if (tty) std::fprintf(stderr, "\r\033[K");
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    nlohmann::json row = {{"image", text}, {"seconds", secs}};
    if (report) {
      row["ok"] = true;
      row["digest"] = report.value().manifest_digest.str();
      row["blobs"] = report.value().blobs;
      row["bytes"] = report.value().bytes;
      if (!flags.json) {
        std::printf("%-50s ok    %3d blobs  %10s  %6.2fs  %s\n", text.c_str(), report.value().blobs,
                    Human(static_cast<double>(report.value().bytes)).c_str(), secs,
                    report.value().manifest_digest.str().c_str());
      }
    } else {
      ++failures;
      row["ok"] = false;
      row["error"] = report.error().ToString();
      if (!flags.json) std::printf("%-50s FAIL  %s\n", text.c_str(), report.error().ToString().c_str());
    }
    results.push_back(row);
  }
  if (flags.json) std::cout << results.dump(2) << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace

void AddPullCommand(CLI::App& app) {
  auto flags = std::make_shared<PullFlags>();
  CLI::App* cmd = app.add_subcommand(
      "pull", "Pull images through this node's agent so that they are cached (and verified) there");
  cmd->add_option("images", flags->images, "Image references, e.g. gcr.io/proj/img:tag")
      ->required();
  cmd->add_option("--agent", flags->agent, "The node agent's registry shim URL")
      ->envname("SHOAL_AGENT_URL")
      ->capture_default_str();
  cmd->add_option("--platform", flags->platform, "os/arch to choose from multi-arch images")
      ->capture_default_str();
  cmd->add_flag("--json", flags->json, "Print results as JSON");
  cmd->callback([flags] { throw CLI::RuntimeError(RunPull(*flags)); });
}

}  // namespace shoal::ctl
