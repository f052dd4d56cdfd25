#include "lib/http/address_policy.h"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace shoal::http {
namespace net = boost::asio;

namespace {

struct Range4 {
  uint32_t base;
  int prefix;
};

constexpr uint32_t V4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return uint32_t(a) << 24 | uint32_t(b) << 16 | uint32_t(c) << 8 | uint32_t(d);
}

// IPv4 ranges that are not global and that Boost.Asio has no predicate for (loopback, multicast
// and 0.0.0.0 it has), from the IANA IPv4 Special-Purpose Address Registry (RFC 6890 and updates).
constexpr std::array<Range4, 13> kNonGlobal4 = {{
    {V4(0, 0, 0, 0), 8},        // "this network" (RFC 791)
    {V4(10, 0, 0, 0), 8},       // private (RFC 1918)
    {V4(100, 64, 0, 0), 10},    // shared address space, CGNAT (RFC 6598)
    {V4(169, 254, 0, 0), 16},   // link-local (RFC 3927), cloud metadata services
    {V4(172, 16, 0, 0), 12},    // private (RFC 1918)
    {V4(192, 0, 0, 0), 24},     // IETF protocol assignments (RFC 6890)
    {V4(192, 0, 2, 0), 24},     // TEST-NET-1 (RFC 5737)
    {V4(192, 88, 99, 0), 24},   // 6to4 relay anycast, deprecated (RFC 7526)
    {V4(192, 168, 0, 0), 16},   // private (RFC 1918)
    {V4(198, 18, 0, 0), 15},    // benchmarking (RFC 2544)
    {V4(198, 51, 100, 0), 24},  // TEST-NET-2 (RFC 5737)
    {V4(203, 0, 113, 0), 24},   // TEST-NET-3 (RFC 5737)
    {V4(240, 0, 0, 0), 4},      // reserved, and the limited broadcast 255.255.255.255
}};

bool IsGlobal4(const net::ip::address_v4& a) {
  if (a.is_unspecified() || a.is_loopback() || a.is_multicast()) return false;
  const uint32_t bits = a.to_uint();
  for (const Range4& r : kNonGlobal4) {
    const uint32_t mask = ~uint32_t(0) << (32 - r.prefix);
    if ((bits & mask) == r.base) return false;
  }
  return true;
}

net::ip::address_v4 Embedded4(const net::ip::address_v6::bytes_type& b, size_t at) {
  return net::ip::make_address_v4(
      net::ip::address_v4::bytes_type{b[at], b[at + 1], b[at + 2], b[at + 3]});
}

bool IsGlobal6(const net::ip::address_v6& a) {
  if (a.is_v4_mapped()) return IsGlobal4(net::ip::make_address_v4(net::ip::v4_mapped, a));
  if (a.is_unspecified() || a.is_loopback() || a.is_link_local() || a.is_site_local() ||
      a.is_multicast()) {
    return false;
  }
  const auto b = a.to_bytes();
  auto starts = [&b](std::initializer_list<uint8_t> prefix) {
    size_t i = 0;
    for (uint8_t v : prefix) {
      if (b[i++] != v) return false;
    }
    return true;
  };
  // NAT64's well-known prefix 64:ff9b::/96 (RFC 6052) reaches the IPv4 address it embeds; its
  // local-use prefix 64:ff9b:1::/48 (RFC 8215) is not global.
  if (starts({0x00, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0})) return IsGlobal4(Embedded4(b, 12));
  if (starts({0x20, 0x02})) return IsGlobal4(Embedded4(b, 2));  // 6to4 (RFC 3056)
  // Only 2000::/3 is allocated as global unicast: everything else (ULA fc00::/7, ::/96 with the
  // deprecated v4-compatible form, 100::/64 discard-only, the rest of the reserved space) is not.
  if ((b[0] & 0xe0) != 0x20) return false;
  if (starts({0x20, 0x01, 0x0d, 0xb8})) return false;             // documentation 2001:db8::/32
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] < 0x02) return false;  // IETF 2001::/23 (Teredo...)
  if (b[0] == 0x3f && b[1] == 0xff && (b[2] & 0xf0) == 0) return false;  // docs 3fff::/20
  return true;
}

}  // namespace

bool IsGlobalAddress(const net::ip::address& address) {
  return address.is_v4() ? IsGlobal4(address.to_v4()) : IsGlobal6(address.to_v6());
}

std::optional<bool> IsGlobalLiteral(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  boost::system::error_code ec;
  net::ip::address address = net::ip::make_address(std::string(host), ec);
  if (ec) return std::nullopt;
  return IsGlobalAddress(address);
}

}  // namespace shoal::http
