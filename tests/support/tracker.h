#pragma once
// A real shoal-tracker process for integration tests (the built binary, SHOAL_TRACKER_BIN).

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "tests/support/process.h"

namespace shoal::testkit {

// Starts shoal-tracker on 127.0.0.1 (port 0 unless `port` is given; the tracker writes its port
// to a file) and waits until /healthz answers. Not thread-safe. The destructor stops it.
class TrackerProcess {
 public:
  // The tracker gets the test kit's tokens and peer CA unless extra_args has its own
  // (--insecure-open, --agent-tokens-file, --peer-ca-cert); {"--peer-ca-cert", ""} starts it with
  // no CA (plain chunk torrents, for agents with --insecure-peers).
  // Errors: kUnavailable with the tracker's log tail.
  static Result<std::unique_ptr<TrackerProcess>> Start(std::vector<std::string> extra_args = {},
                                                       uint16_t port = 0);
  // Like Start, but listening on `host` and run through `prefix` (e.g. {"ip", "netns", "exec",
  // "NS"} for a tracker inside a network namespace the test made).
  static Result<std::unique_ptr<TrackerProcess>> StartAt(std::vector<std::string> prefix,
                                                         std::string host,
                                                         std::vector<std::string> extra_args = {});
  ~TrackerProcess();

  // "http://127.0.0.1:PORT", and its announce URL with the test cluster's announce key.
  // Unless started with --insecure-open (or its own token files) the tracker takes the test
  // kit's tokens (tests/support/tokens.h).
  std::string Url() const;
  std::string AnnounceUrl() const;
  uint16_t port() const { return port_; }
  // MetricSum over the current /metrics (0 if unreachable).
  double Metric(const std::string& name,
                const std::map<std::string, std::string>& labels = {}) const;
  // True while the process has not exited.
  bool Running() { return process_ && process_->Running(); }
  // SIGTERM and wait; returns the exit status.
  int Stop();
  void Kill();
  // Starts again on the same port with the same arguments and then `more` (state is lost).
  // Errors: as Start.
  Status Restart(const std::vector<std::string>& more = {});
  std::string LogTail() const;

 private:
  TrackerProcess(std::vector<std::string> args, uint16_t port)
      : args_(std::move(args)), port_(port) {}
  Status Launch();

  std::vector<std::string> args_;
  uint16_t port_;
  std::vector<std::string> prefix_;
  std::string host_ = "127.0.0.1";
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<Process> process_;
  int launches_ = 0;
};

}  // namespace shoal::testkit
