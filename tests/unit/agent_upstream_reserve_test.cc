// The upstream reserve (agent/upstream_reserve.h): the peer download cap is applied with the
// first upstream fetch and lifted with the last, and the link speed is read from the default
// route's interface.

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "agent/upstream_reserve.h"

namespace shoal::agent {
namespace {

TEST_CASE("upstream reserve: the cap holds from the first upstream fetch to the end of the last") {
  std::vector<int64_t> applied;
  UpstreamReserve r(600, [&](int64_t c) { applied.push_back(c); });
  {
    UpstreamReserve::Hold a = r.Acquire();
    CHECK(applied == std::vector<int64_t>{600});
    UpstreamReserve::Hold b = r.Acquire();
    CHECK(r.holds() == 2);
    CHECK(applied.size() == 1);  // already capped
    a.Release();
    CHECK(applied.size() == 1);  // b still fetches
    UpstreamReserve::Hold moved = std::move(b);
    CHECK(r.holds() == 1);
  }
  CHECK(applied == std::vector<int64_t>{600, 0});
  CHECK(r.holds() == 0);
  // A second round caps again.
  { UpstreamReserve::Hold c = r.Acquire(); }
  CHECK(applied == std::vector<int64_t>{600, 0, 600, 0});
}

TEST_CASE("upstream reserve: no cap configured never applies one, and a late hold outlives it") {
  std::vector<int64_t> applied;
  {
    UpstreamReserve off(0, [&](int64_t c) { applied.push_back(c); });
    UpstreamReserve::Hold h = off.Acquire();
    CHECK(off.holds() == 0);
  }
  CHECK(applied.empty());
  UpstreamReserve::Hold late;
  {
    UpstreamReserve r(100, [&](int64_t c) { applied.push_back(c); });
    late = r.Acquire();
  }
  late.Release();  // the reserve is gone: released without calling into it
  CHECK(applied == std::vector<int64_t>{100});
}

TEST_CASE("upstream reserve: the default route's interface from /proc/net/route") {
  const std::string table =
      "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
      "docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
      "eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
      "eth1\t00000000\t0102A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n";
  auto iface = DefaultRouteInterface(table);
  REQUIRE(iface);
  CHECK(iface.value() == "eth0");
  auto none = DefaultRouteInterface(
      "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n"
      "docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\n");
  REQUIRE(!none);
  CHECK(none.error().code == ErrorCode::kNotFound);
  CHECK(!DefaultRouteInterface(""));
}

TEST_CASE("upstream reserve: the link speed from sysfs, and no speed for virtual or down links") {
  namespace fs = std::filesystem;
  const std::string root =
      (fs::temp_directory_path() / ("shoal-link-" + std::to_string(std::random_device{}())))
          .string();
  struct Cleanup {
    std::string path;
    ~Cleanup() { fs::remove_all(path); }
  } cleanup{root};
  auto write = [&](const std::string& iface, const std::string& text) {
    fs::create_directories(root + "/" + iface);
    std::ofstream(root + "/" + iface + "/speed") << text;
  };
  write("eth0", "25000\n");
  write("veth1", "-1\n");
  write("down0", "");
  auto eth0 = LinkMbit(root, "eth0");
  REQUIRE(eth0);
  CHECK(eth0.value() == 25000);
  CHECK(LinkMbit(root, "veth1").error().code == ErrorCode::kNotFound);
  CHECK(LinkMbit(root, "down0").error().code == ErrorCode::kNotFound);
  CHECK(LinkMbit(root, "missing").error().code == ErrorCode::kNotFound);
  CHECK(LinkMbit(root, "../etc").error().code == ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::agent
