#include "tests/support/tracker.h"

#include <algorithm>
#include <filesystem>

#include "lib/auth/tokens.h"
#include "tests/support/http_client.h"
#include "tests/support/tokens.h"

namespace shoal::testkit {

Result<std::unique_ptr<TrackerProcess>> TrackerProcess::Start(std::vector<std::string> extra_args,
                                                              uint16_t port) {
  std::unique_ptr<TrackerProcess> t(new TrackerProcess(std::move(extra_args), port));
  t->dir_ = std::make_unique<TempDir>("shoal-tracker");
  if (auto st = t->Launch(); !st) return st.error();
  return t;
}

Result<std::unique_ptr<TrackerProcess>> TrackerProcess::StartAt(
    std::vector<std::string> prefix, std::string host, std::vector<std::string> extra_args) {
  std::unique_ptr<TrackerProcess> t(new TrackerProcess(std::move(extra_args), 0));
  t->prefix_ = std::move(prefix);
  t->host_ = std::move(host);
  t->dir_ = std::make_unique<TempDir>("shoal-tracker");
  if (auto st = t->Launch(); !st) return st.error();
  return t;
}

TrackerProcess::~TrackerProcess() {
  if (process_) process_->Stop();
}

Status TrackerProcess::Launch() {
  std::string port_file = dir_->Sub("port");
  std::filesystem::remove(port_file);
  std::vector<std::string> argv = prefix_;
  std::vector<std::string> own = {SHOAL_TRACKER_BIN,
                                  "--listen",
                                  host_ + ":" + std::to_string(port_),
                                  "--port-file",
                                  port_file,
                                  "--log-format",
                                  "text",
                                  "--log-level",
                                  "debug"};
  argv.insert(argv.end(), own.begin(), own.end());
  auto has = [&](const char* flag) {
    return std::find(args_.begin(), args_.end(), flag) != args_.end();
  };
  if (!has("--insecure-open") && !has("--agent-tokens-file")) {
    argv.insert(argv.end(), {"--agent-tokens-file", Tokens().agent_file, "--operator-tokens-file",
                             Tokens().operator_file});
  }
  if (!has("--peer-ca-cert")) {
    argv.insert(argv.end(), {"--peer-ca-cert", Tokens().peer_ca_cert});
  }
  for (size_t i = 0; i < args_.size(); ++i) {
    // {"--peer-ca-cert", ""}: no CA at all (agents with plain peers).
    if (args_[i] == "--peer-ca-cert" && i + 1 < args_.size() && args_[i + 1].empty()) {
      ++i;
      continue;
    }
    argv.push_back(args_[i]);
  }
  auto proc = Process::Start(argv, dir_->Sub("tracker." + std::to_string(launches_++) + ".log"));
  if (!proc) return proc.error();
  process_ = std::move(proc.value());
  bool up = WaitUntil([&] { return !process_->Running() || !ReadFile(port_file).empty(); },
                      std::chrono::seconds(20));
  std::string port = ReadFile(port_file);
  if (!up || port.empty() || !process_->Running()) {
    return MakeError(ErrorCode::kUnavailable,
                     "shoal-tracker did not start: " + process_->LogTail());
  }
  port_ = static_cast<uint16_t>(std::stoi(port));
  if (!WaitForHttp(Url() + "/healthz", std::chrono::seconds(20))) {
    return MakeError(ErrorCode::kUnavailable,
                     "shoal-tracker does not answer: " + process_->LogTail());
  }
  return Ok();
}

std::string TrackerProcess::Url() const { return "http://" + host_ + ":" + std::to_string(port_); }

std::string TrackerProcess::AnnounceUrl() const {
  return Url() + "/announce?auth=" + auth::AnnounceKey(Tokens().agent);
}

double TrackerProcess::Metric(const std::string& name,
                              const std::map<std::string, std::string>& labels) const {
  auto r = HttpGet(Url() + "/metrics");
  return r && r.value().status == 200 ? MetricSum(r.value().body, name, labels) : 0;
}

int TrackerProcess::Stop() { return process_ ? process_->Stop() : 0; }
void TrackerProcess::Kill() {
  if (process_) process_->Kill();
}
Status TrackerProcess::Restart(const std::vector<std::string>& more) {
  if (process_) process_->Stop();
  args_.insert(args_.end(), more.begin(), more.end());
  return Launch();
}
std::string TrackerProcess::LogTail() const { return process_ ? process_->LogTail() : ""; }

}  // namespace shoal::testkit
