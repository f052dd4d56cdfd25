#pragma once
// A network namespace that a test makes, with one veth pair: 198.18.<n>.1/30 on the host side,
// 198.18.<n>.2 inside (198.18.0.0/15 is the benchmarking range, never routed). Needs root.
// Removed by the destructor.

#include <string>
#include <vector>

namespace shoal::testkit {

class NetNs {
 public:
  // n (1..250) picks the /30 and, with the pid, the names: tests of one process use distinct n.
  explicit NetNs(int n);
  ~NetNs();
  NetNs(const NetNs&) = delete;
  NetNs& operator=(const NetNs&) = delete;

  bool ok() const { return ok_; }
  const std::string& name() const { return name_; }
  const std::string& host() const { return host_; }      // the host side's address
  const std::string& inside() const { return inside_; }  // the namespace side's address
  // {"ip", "netns", "exec", name()}: a prefix that runs a command inside.
  std::vector<std::string> Exec() const { return {"ip", "netns", "exec", name_}; }

 private:
  std::string name_, host_, inside_, host_if_;
  bool ok_ = false;
};

}  // namespace shoal::testkit
