#include "tests/support/netns.h"

#include <unistd.h>

#include <chrono>

#include "tests/support/process.h"

namespace shoal::testkit {
namespace {

bool Run(std::vector<std::string> argv) {
  return RunCommand(std::move(argv), std::chrono::seconds(10)).has_value();
}

}  // namespace

NetNs::NetNs(int n)
    : name_("shoal-ns" + std::to_string(::getpid() % 10000) + "-" + std::to_string(n)),
      host_("198.18." + std::to_string(n) + ".1"),
      inside_("198.18." + std::to_string(n) + ".2") {
  // Interface names have at most 15 characters.
  const std::string base = "sh" + std::to_string(::getpid() % 10000) + "n" + std::to_string(n);
  const std::string h = base + "h";
  const std::string i = base + "i";
  host_if_ = h;
  ok_ = Run({"ip", "netns", "add", name_}) &&
        Run({"ip", "link", "add", h, "type", "veth", "peer", "name", i}) &&
        Run({"ip", "link", "set", i, "netns", name_}) &&
        Run({"ip", "addr", "add", host_ + "/30", "dev", h}) &&
        Run({"ip", "link", "set", h, "up"}) &&
        Run({"ip", "netns", "exec", name_, "ip", "addr", "add", inside_ + "/30", "dev", i}) &&
        Run({"ip", "netns", "exec", name_, "ip", "link", "set", i, "up"}) &&
        Run({"ip", "netns", "exec", name_, "ip", "link", "set", "lo", "up"});
}

NetNs::~NetNs() {
  (void)RunCommand({"ip", "link", "del", host_if_}, std::chrono::seconds(10));
  (void)RunCommand({"ip", "netns", "del", name_}, std::chrono::seconds(10));
}

}  // namespace shoal::testkit
