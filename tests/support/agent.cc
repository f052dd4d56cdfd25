#include "tests/support/agent.h"

#include <algorithm>

#include <filesystem>

#include "tests/support/http_client.h"
#include "tests/support/tokens.h"

namespace shoal::testkit {

Result<std::unique_ptr<Agent>> Agent::Start(AgentOptions options) {
  std::unique_ptr<Agent> agent(new Agent(std::move(options)));
  agent->dir_ = std::make_unique<TempDir>("shoal-agent");
  if (auto st = agent->Launch(); !st) return st.error();
  return agent;
}

Agent::~Agent() {
  if (process_) process_->Stop();
}

Status Agent::Launch() {
  std::string port_file = dir_->Sub("port");
  std::filesystem::remove(port_file);
  std::vector<std::string> argv = {
      SHOAL_AGENT_BIN,    "--listen",     "127.0.0.1:0", "--port-file", port_file, "--cache-dir",
      options_.cache_dir, "--log-format", "text"};
  for (const auto& u : options_.upstreams) {
    argv.push_back("--upstream");
    argv.push_back(u);
  }
  const auto& extra = options_.extra_args;
  auto has = [&](const char* flag) { return std::find(extra.begin(), extra.end(), flag) != extra.end(); };
  if (!has("--log-level")) argv.insert(argv.end(), {"--log-level", "debug"});
  if (!has("--tracker-token-file")) {
    argv.insert(argv.end(), {"--tracker-token-file", Tokens().agent_file});
  }
  if (!has("--peer-ca-cert") && !has("--insecure-peers")) {
    argv.insert(argv.end(),
                {"--peer-ca-cert", Tokens().peer_ca_cert, "--peer-ca-key", Tokens().peer_ca_key});
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto proc = Process::Start(argv, dir_->Sub("agent.log"));
  if (!proc) return proc.error();
  process_ = std::move(proc.value());
  bool up = WaitUntil([&] { return !process_->Running() || !ReadFile(port_file).empty(); },
                      std::chrono::seconds(20));
  std::string port = ReadFile(port_file);
  if (!up || port.empty() || !process_->Running()) {
    return MakeError(ErrorCode::kUnavailable, "shoal-agent did not start: " + process_->LogTail());
  }
  port_ = static_cast<uint16_t>(std::stoi(port));
  if (!WaitForHttp(Url() + "/v2/", std::chrono::seconds(20))) {
    return MakeError(ErrorCode::kUnavailable,
                     "shoal-agent does not answer: " + process_->LogTail());
  }
  return Ok();
}

std::string Agent::HostPort() const { return "127.0.0.1:" + std::to_string(port_); }
std::string Agent::Url() const { return "http://" + HostPort(); }

std::string Agent::Metrics() const {
  auto r = HttpGet(Url() + "/metrics");
  return r && r.value().status == 200 ? r.value().body : "";
}

double Agent::Metric(const std::string& name,
                     const std::map<std::string, std::string>& labels) const {
  return MetricSum(Metrics(), name, labels);
}

int Agent::Stop() { return process_ ? process_->Stop() : 0; }
void Agent::Kill() {
  if (process_) process_->Kill();
}
Status Agent::Restart() {
  if (process_) process_->Stop();
  return Launch();
}
std::string Agent::LogTail() const { return process_ ? process_->LogTail() : ""; }
std::string Agent::Log() const { return process_ ? process_->Log() : ""; }

}  // namespace shoal::testkit
