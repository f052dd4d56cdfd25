#include "tracker/swarms/ids.h"

#include <utility>

#include <algorithm>
#include <cstring>

#include <boost/asio/ip/address_v4.hpp>
#include <boost/asio/ip/address_v6.hpp>

namespace shoal::tracker {

PeerEndpoint PeerEndpoint::FromV4(const std::array<uint8_t, 4>& ip, uint16_t port) {
  PeerEndpoint ep;
  std::copy(ip.begin(), ip.end(), ep.ip_.begin());
  ep.port_ = port;
  ep.v6_ = false;
  return ep;
}

PeerEndpoint PeerEndpoint::FromV6(const std::array<uint8_t, 16>& ip, uint16_t port) {
  static constexpr std::array<uint8_t, 12> kMappedPrefix = {0, 0, 0, 0, 0,    0,
                                                            0, 0, 0, 0, 0xff, 0xff};
  if (std::equal(kMappedPrefix.begin(), kMappedPrefix.end(), ip.begin())) {
    return FromV4({ip[12], ip[13], ip[14], ip[15]}, port);
  }
  PeerEndpoint ep;
  ep.ip_ = ip;
  ep.port_ = port;
  ep.v6_ = true;
  return ep;
}

PeerEndpoint PeerEndpoint::FromAddress(const boost::asio::ip::address& address, uint16_t port) {
  if (address.is_v4()) return FromV4(address.to_v4().to_bytes(), port);
  return FromV6(address.to_v6().to_bytes(), port);
}

void PeerEndpoint::AppendCompact(std::string& out) const {
  size_t n = v6_ ? 16 : 4;
  out.append(reinterpret_cast<const char*>(ip_.data()), n);
  out.push_back(static_cast<char>(port_ >> 8));
  out.push_back(static_cast<char>(port_ & 0xff));
}

std::string PeerEndpoint::ToString() const {
  if (!v6_) {
    boost::asio::ip::address_v4 ip({ip_[0], ip_[1], ip_[2], ip_[3]});
    return ip.to_string() + ":" + std::to_string(port_);
  }
  boost::asio::ip::address_v6 ip(ip_);
  return "[" + ip.to_string() + "]:" + std::to_string(port_);
}

size_t PeerEndpoint::Hash() const {
  // The standard library's byte hash reads the key a word at a time; hashing the 16 address
  // bytes one by one (boost::hash_range) made it the cluster view's main cost.
  std::array<char, 19> key;
  std::memcpy(key.data(), ip_.data(), ip_.size());
  key[16] = static_cast<char>(port_ >> 8);
  key[17] = static_cast<char>(port_ & 0xff);
  key[18] = v6_ ? 1 : 0;
  return std::hash<std::string_view>()(std::string_view(key.data(), key.size()));
}

}  // namespace shoal::tracker
