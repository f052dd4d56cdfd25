#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <cstdio>
#include <iostream>
#include <sstream>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "tools/shoalctl/agent_client.h"
#include "tools/shoalctl/commands.h"

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

}  // namespace

void AddStatusCommand(CLI::App& app) {
  auto agent = std::make_shared<std::string>("http://127.0.0.1:5000");
  auto raw = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("status", "Show a node agent's health and counters");
  cmd->add_option("--agent", *agent, "The node agent's registry shim URL")
      ->envname("SHOAL_AGENT_URL")
      ->capture_default_str();
  cmd->add_flag("--raw", *raw, "Print the Prometheus text as is");
  cmd->callback([agent, raw] { throw CLI::RuntimeError(RunStatus(*agent, *raw)); });
}

}  // namespace shoal::ctl
