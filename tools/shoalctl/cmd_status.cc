#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "lib/auth/tokens.h"
#include "tools/shoalctl/agent_client.h"
#include "tools/shoalctl/cluster_status.h"
#include "tools/shoalctl/commands.h"
#include "tools/shoalctl/json_call.h"

namespace shoal::ctl {
namespace {

int RunStatus(const std::string& agent_url, bool raw) {
  auto agent = http::Url::Parse(agent_url);
  if (!agent) {
    std::cerr << "shoalctl: --agent: " << agent.error().message << "\n";
    return 2;
  }
  boost::asio::io_context ioc;
  AgentClient client(ioc, agent.value());
  Result<std::string> text = MakeError(ErrorCode::kInternal, "not run");
  boost::asio::co_spawn(
      ioc, [&]() -> boost::asio::awaitable<void> { text = co_await client.Metrics(); },
      boost::asio::detached);
  ioc.run();
  if (!text) {
    std::cerr << "shoalctl: agent " << agent_url << " unreachable: " << text.error().message << "\n";
    return 1;
  }
  if (raw) {
    std::cout << text.value();
    return 0;
  }
  std::printf("agent %s: up\n", agent_url.c_str());
  std::istringstream in(text.value());
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::printf("  %s\n", line.c_str());
  }
  return 0;
}

struct ClusterFlags {
  bool cluster = false;
  std::vector<std::string> trackers;
  std::string operator_token_file;
  bool json = false;
  bool watch = false;
  double interval_s = 2;
  std::string timeout = "0";
  std::string image;
  std::vector<std::string> nodes;
};

// Exit codes of `status --cluster` (also in --help).
constexpr int kExitOk = 0, kExitFailed = 1, kExitUsage = 2, kExitNotYet = 3;

volatile std::sig_atomic_t g_interrupted = 0;

// Every replica's /v1/cluster, merged. A replica that does not answer is listed as such.
nlohmann::json FetchCluster(const ClusterFlags& f, const std::string& token) {
  std::vector<ReplicaView> views;
  for (const std::string& url : f.trackers) {
    ReplicaView r{url, std::nullopt, ""};
    auto got = JsonCall(url, boost::beast::http::verb::get, "/v1/cluster", "", "--tracker", token);
    if (!got) {
      r.error = got.error().ToString();
    } else if (got.value().status != 200) {
      r.error = "HTTP " + std::to_string(got.value().status) + ": " + got.value().Error();
    } else {
      r.view = got.value().body;
    }
    views.push_back(std::move(r));
  }
  return MergeClusterViews(views);
}

int RunClusterStatus(const ClusterFlags& f) {
  if (f.trackers.empty()) {
    std::cerr << "shoalctl status --cluster: needs --tracker URL (or SHOAL_TRACKERS)\n";
    return kExitUsage;
  }
  if (!f.nodes.empty() && f.image.empty()) {
    std::cerr << "shoalctl status --cluster: --nodes needs --image\n";
    return kExitUsage;
  }
  auto timeout = ParseDuration(f.timeout);
  if (!timeout) {
    std::cerr << "shoalctl status --cluster: --timeout \"" << f.timeout
              << "\" is not a duration (90s, 15m, 2h; 0 = none)\n";
    return kExitUsage;
  }
  std::string token;
  if (!f.operator_token_file.empty()) {
    auto tokens = auth::ReadTokens(f.operator_token_file);
    if (!tokens) {
      std::cerr << "shoalctl status --cluster: --operator-token-file: " << tokens.error().message
                << "\n";
      return kExitUsage;
    }
    token = tokens.value().front();
  }
  const bool tty = ::isatty(STDOUT_FILENO) && !f.json;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(*timeout);
  std::signal(SIGINT, [](int) { g_interrupted = 1; });
  for (;;) {
    nlohmann::json merged = FetchCluster(f, token);
    int code = merged["replicas_up"].get<uint64_t>() > 0 ? kExitOk : kExitFailed;
    std::string why;
    if (!f.image.empty()) {
      ImageState state = ImageCompletion(merged, f.image, f.nodes, &why);
      merged["image"] = {{"ref", f.image},
                         {"state", state == ImageState::kComplete     ? "complete"
                                   : state == ImageState::kInProgress ? "in_progress"
                                   : state == ImageState::kFailed     ? "failed"
                                                                      : "unknown"},
                         {"detail", why}};
      code = state == ImageState::kComplete ? kExitOk
             : state == ImageState::kFailed ? kExitFailed
                                            : kExitNotYet;
    }
    if (f.json) {
      std::cout << merged.dump() << std::endl;
    } else {
      // On a terminal --watch redraws in place; elsewhere each round is printed after the last.
      if (tty && f.watch) std::cout << "\x1b[H\x1b[J";
      std::cout << RenderClusterStatus(merged);
      if (!f.image.empty()) std::cout << "\nimage " << f.image << ": " << why << "\n";
      std::cout.flush();
    }
    bool settled = f.image.empty() ? false : code != kExitNotYet;
    if (!f.watch || settled || g_interrupted) return code;
    if (*timeout > 0 && std::chrono::steady_clock::now() >= deadline) return code;
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(static_cast<int64_t>(f.interval_s * 1000));
    while (!g_interrupted && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (g_interrupted) return code;
  }
}

}  // namespace

void AddStatusCommand(CLI::App& app) {
  auto agent = std::make_shared<std::string>("http://127.0.0.1:5000");
  auto raw = std::make_shared<bool>(false);
  auto f = std::make_shared<ClusterFlags>();
  CLI::App* cmd = app.add_subcommand(
      "status",
      "Show a node agent's health and counters, or (--cluster) the cluster as the tracker "
      "replicas see it. Exit codes with --cluster: 0 ok (with --image: complete on the "
      "nodes), 1 no replica answered (with --image: failed), 2 usage, 3 --image not yet "
      "complete");
  cmd->add_option("--agent", *agent, "The node agent's registry shim URL")
      ->envname("SHOAL_AGENT_URL")
      ->capture_default_str();
  cmd->add_flag("--raw", *raw, "Print the Prometheus text as is");
  cmd->add_flag("--cluster", f->cluster,
                "The whole cluster: every tracker replica's view (GET /v1/cluster) merged")
      ->envname("SHOAL_STATUS_CLUSTER");
  cmd->add_option("--tracker", f->trackers,
                  "Tracker replica URLs (repeatable or comma-separated): all of them, so every "
                  "blob's owner is asked")
      ->envname("SHOAL_TRACKERS")
      ->delimiter(',');
  cmd->add_option("--operator-token-file", f->operator_token_file,
                  "File holding an operator token of the trackers")
      ->envname("SHOAL_OPERATOR_TOKEN_FILE");
  cmd->add_flag("--json", f->json, "Print the merged view as JSON (one line per round)");
  cmd->add_flag("--watch", f->watch,
                "Redraw every --interval until interrupted (with --image: until complete or "
                "failed)");
  cmd->add_option("--interval", f->interval_s, "Seconds between rounds of --watch")
      ->check(CLI::Range(0.2, 3600.0))
      ->capture_default_str();
  cmd->add_option("--timeout", f->timeout, "Stop --watch after this long (90s, 15m; 0 = never)")
      ->capture_default_str();
  cmd->add_option("--image", f->image,
                  "Say (and exit 0/1/3) whether this image is complete, as far as prefetch "
                  "jobs naming it report");
  cmd->add_option("--nodes", f->nodes, "With --image: only these nodes (comma-separated)")
      ->delimiter(',');
  cmd->callback([agent, raw, f] {
    if (f->cluster) throw CLI::RuntimeError(RunClusterStatus(*f));
    throw CLI::RuntimeError(RunStatus(*agent, *raw));
  });
}

}  // namespace shoal::ctl
