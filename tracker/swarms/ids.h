#pragma once
// Strong types of the BitTorrent tracker protocol: 20-byte info-hashes and peer ids, and a peer's
// (IP, port) endpoint in the byte form that compact tracker responses use.

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/ip/address.hpp>

namespace shoal::tracker {

// A 20-byte identifier; Tag keeps InfoHash and PeerId apart. Plain value type, all zero by
// default.
template <typename Tag>
class Id20 {
 public:
  static constexpr size_t kSize = 20;

  Id20() = default;
  // The identifier made of exactly these 20 bytes; nullopt for any other length.
  static std::optional<Id20> FromBytes(std::string_view bytes) {
    if (bytes.size() != kSize) return std::nullopt;
    Id20 id;
    for (size_t i = 0; i < kSize; ++i) id.bytes_[i] = bytes[i];
    return id;
  }

  // The 20 raw bytes (a view into this object).
  std::string_view bytes() const { return std::string_view(bytes_.data(), kSize); }
  // 40 lower-case hex digits, the usual printed form of an info-hash.
  std::string hex() const {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out(2 * kSize, '0');
    for (size_t i = 0; i < kSize; ++i) {
      auto b = static_cast<unsigned char>(bytes_[i]);
      out[2 * i] = kDigits[b >> 4];
      out[2 * i + 1] = kDigits[b & 15];
    }
    return out;
  }

  auto operator<=>(const Id20&) const = default;

 private:
  std::array<char, kSize> bytes_{};
};

struct InfoHashTag {};
struct PeerIdTag {};
// A torrent's v1 info-hash (SHA-1 of the info dictionary), or a truncated v2 one.
using InfoHash = Id20<InfoHashTag>;
// The 20-byte id a client picks for itself.
using PeerId = Id20<PeerIdTag>;

// Where a peer accepts connections: IPv4 or IPv6 address bytes (network order) and a port.
// IPv4-mapped IPv6 addresses are stored as IPv4 (see FromV6). Plain value type.
class PeerEndpoint {
 public:
  PeerEndpoint() = default;
  // An IPv4 endpoint.
  static PeerEndpoint FromV4(const std::array<uint8_t, 4>& ip, uint16_t port);
  // An IPv6 endpoint, or the IPv4 one if ip is IPv4-mapped (::ffff:a.b.c.d), as dual-stack
  // sockets report IPv4 clients.
  static PeerEndpoint FromV6(const std::array<uint8_t, 16>& ip, uint16_t port);
  // FromV4 or FromV6 of a socket's address.
  static PeerEndpoint FromAddress(const boost::asio::ip::address& address, uint16_t port);

  bool is_v6() const { return v6_; }
  uint16_t port() const { return port_; }
  // The compact form: 4 address bytes + 2 port bytes (IPv4) or 16 + 2 (IPv6), network order,
  // appended to out. This is what "peers" and "peers6" concatenate.
  void AppendCompact(std::string& out) const;
  // "1.2.3.4:6881" or "[::1]:6881".
  std::string ToString() const;

  auto operator<=>(const PeerEndpoint&) const = default;

  // For unordered containers.
  size_t Hash() const;

 private:
  std::array<uint8_t, 16> ip_{};  // IPv4 uses the first 4 bytes
  uint16_t port_ = 0;
  bool v6_ = false;
};

}  // namespace shoal::tracker

template <typename Tag>
struct std::hash<shoal::tracker::Id20<Tag>> {
  size_t operator()(const shoal::tracker::Id20<Tag>& id) const noexcept {
    return std::hash<std::string_view>()(id.bytes());
  }
};

template <>
struct std::hash<shoal::tracker::PeerEndpoint> {
  size_t operator()(const shoal::tracker::PeerEndpoint& ep) const noexcept { return ep.Hash(); }
};
