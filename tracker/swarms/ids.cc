#include "tracker/swarms/ids.h"

#include <utility>

#include <algorithm>

#include <boost/asio/ip/address_v4.hpp>
#include <boost/asio/ip/address_v6.hpp>
#include <boost/functional/hash.hpp>

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
  size_t seed = boost::hash_range(ip_.begin(), ip_.end());
  boost::hash_combine(seed, port_);
  boost::hash_combine(seed, v6_);
  return seed;
}

}  // namespace shoal::tracker
