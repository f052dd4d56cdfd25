#include <doctest/doctest.h>

#include "lib/http/address_policy.h"

namespace shoal::http {
namespace {

bool Global(const char* text) { return IsGlobalAddress(boost::asio::ip::make_address(text)); }

}  // namespace

TEST_CASE("address policy: public unicast addresses are global") {
  for (const char* a :
       {"1.1.1.1", "8.8.8.8", "34.117.59.81", "100.63.255.255", "100.128.0.0", "172.15.255.255",
        "172.32.0.0", "192.167.255.255", "198.17.255.255", "198.20.0.0", "223.255.255.255",
        "2001:4860:4860::8888", "2a00:1450:4001:80b::200e", "2606:4700::1111", "::ffff:8.8.8.8",
        "64:ff9b::808:808", "2002:808:808::1"}) {
    CAPTURE(a);
    CHECK(Global(a));
  }
}

TEST_CASE("address policy: loopback, private, link-local and special ranges are not global") {
  for (const char* a :
       {// IPv4: unspecified, "this network", loopback, RFC 1918, CGNAT, link-local (cloud
        // metadata), IETF, documentation, benchmarking, 6to4 relay, multicast, reserved.
        "0.0.0.0", "0.1.2.3", "127.0.0.1", "127.255.255.254", "10.0.0.1", "10.1.2.3", "172.16.0.1",
        "172.31.255.255", "192.168.1.1", "100.64.0.1", "100.127.255.255", "169.254.169.254",
        "192.0.0.8", "192.0.2.1", "198.51.100.7", "203.0.113.9", "198.18.0.1", "198.19.255.255",
        "192.88.99.1", "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
        // IPv6: unspecified, loopback, v4-compatible, ULA, link-local, site-local,
        // multicast, documentation, IETF (Teredo), discard-only, reserved space.
        "::", "::1", "::127.0.0.1", "fc00::1", "fd12:3456::1", "fe80::1", "febf::1", "fec0::1",
        "ff02::1", "ff0e::1", "2001:db8::1", "3fff::1", "2001::1", "2001:1ff::1", "100::1",
        "4000::1", "e000::1",
        // IPv6 forms of non-global IPv4 addresses: v4-mapped, NAT64, 6to4; local NAT64.
        "::ffff:127.0.0.1", "::ffff:10.1.2.3", "::ffff:169.254.169.254", "::ffff:0.0.0.0",
        "::ffff:192.168.0.1", "::ffff:100.64.0.1", "64:ff9b::7f00:1", "64:ff9b::a01:203",
        "2002:7f00:1::1", "2002:a9fe:a9fe::", "64:ff9b:1::808:808"}) {
    CAPTURE(a);
    CHECK_FALSE(Global(a));
  }
}

TEST_CASE("address policy: literals are judged, bracketed or not, names are left to the resolver") {
  CHECK(IsGlobalLiteral("127.0.0.1") == false);
  CHECK(IsGlobalLiteral("[::1]") == false);
  CHECK(IsGlobalLiteral("::1") == false);
  CHECK(IsGlobalLiteral("[::ffff:7f00:1]") == false);
  CHECK(IsGlobalLiteral("[fe80::1%eth0]") == false);
  CHECK(IsGlobalLiteral("8.8.8.8") == true);
  CHECK(IsGlobalLiteral("[2606:4700::1111]") == true);
  CHECK_FALSE(IsGlobalLiteral("localhost").has_value());
  CHECK_FALSE(IsGlobalLiteral("gcr.io").has_value());
  CHECK_FALSE(IsGlobalLiteral("").has_value());
}

}  // namespace shoal::http
