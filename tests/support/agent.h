#pragma once
// A real shoal-agent process for integration tests (the built binary, SHOAL_AGENT_BIN).

#include <memory>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "tests/support/process.h"

namespace shoal::testkit {

struct AgentOptions {
  std::string cache_dir;                 // required: survives Restart()
  std::vector<std::string> upstreams;    // "docker.io=http://127.0.0.1:PORT"
  std::vector<std::string> extra_args;   // e.g. {"--credentials", path}
};

// Starts shoal-agent on 127.0.0.1 with port 0 (the agent writes its port to a file) and waits
// until /v2/ answers. Not thread-safe. The destructor stops it.
class Agent {
 public:
  // Errors: kUnavailable with the agent's log tail.
  static Result<std::unique_ptr<Agent>> Start(AgentOptions options);
  ~Agent();

  // "127.0.0.1:PORT" and "http://127.0.0.1:PORT".
  std::string HostPort() const;
  std::string Url() const;
  // The /metrics text; "" if unreachable.
  std::string Metrics() const;
  // MetricSum over the current /metrics.
  double Metric(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
  // The agent's pid (0 when not running) and whether it still runs.
  pid_t pid() const { return process_ ? process_->pid() : 0; }
  bool Running() { return process_ && process_->Running(); }
  // SIGTERM and wait; returns the exit status.
  int Stop();
  // SIGKILL (a crash).
  void Kill();
  // Starts again with the same options (new port). Errors: as Start.
  Status Restart();
  std::string LogTail() const;
  // The agent's whole log (stderr) so far.
  std::string Log() const;

 private:
  explicit Agent(AgentOptions options) : options_(std::move(options)) {}
  Status Launch();

  AgentOptions options_;
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<Process> process_;
  uint16_t port_ = 0;
};

}  // namespace shoal::testkit
