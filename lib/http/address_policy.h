#pragma once
// Which peers the HTTP client may connect to, and which IP addresses are globally routable: the
// check behind AddressPolicy::kGlobalOnly, which keeps the agent from connecting into the node's
// loopback or the cluster's private networks for registries that clients name.

#include <utility>  // must precede Boost.Asio with GCC 12 + Boost 1.74

#include <optional>
#include <string_view>

#include <boost/asio/ip/address.hpp>

namespace shoal::http {

// Which peer addresses a request may connect to (http::Request::addresses).
enum class AddressPolicy {
  kAny,         // wherever the host resolves to
  kGlobalOnly,  // only if the host resolves and every address it has is global (IsGlobalAddress)
};

// True for a globally routable unicast address. False for unspecified, loopback, link-local,
// multicast, private (RFC 1918, CGNAT 100.64.0.0/10, IPv6 ULA fc00::/7), documentation,
// benchmarking, reserved and the other special-purpose ranges of the IANA registries; an IPv6
// address that embeds an IPv4 one (v4-mapped ::ffff:0:0/96, NAT64 64:ff9b::/96, 6to4
// 2002::/16) is judged by that IPv4 address. Pure; thread-safe.
bool IsGlobalAddress(const boost::asio::ip::address& address);

// For a host as in a URL or an image reference (a DNS name, an IPv4 literal or an IPv6 literal
// with or without brackets, no port): IsGlobalAddress of the literal, or nullopt for a DNS name.
std::optional<bool> IsGlobalLiteral(std::string_view host);

}  // namespace shoal::http
