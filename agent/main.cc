// shoal-agent: the node agent (blob cache, upstream fetcher, registry shim).
#include <CLI/CLI.hpp>

#include "agent/agent.h"
#include "agent/config.h"

int main(int argc, char** argv) {
  CLI::App app{"shoal-agent: node-local registry mirror and blob cache"};
  app.set_version_flag("--version", "shoal-agent 0.1.0");
  shoal::agent::AgentConfig config;
  shoal::agent::AddAgentFlags(app, config);
  CLI11_PARSE(app, argc, argv);
  return shoal::agent::RunAgent(config);
}
