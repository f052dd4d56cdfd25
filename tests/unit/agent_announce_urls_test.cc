// agent/tracker_client.*: the announce URLs chunk torrents get: udp:// on the replica's port for
// http:// replicas with udp_announce, https:// replicas kept on HTTPS, IPv6 literals bracketed,
// and the rendezvous order per blob.

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/tracker_client.h"
#include "lib/core/digest.h"

namespace shoal::agent {
namespace {

TrackerClientOptions Options(bool udp) {
  TrackerClientOptions o;
  for (const char* u : {"http://10.0.0.5:7070", "https://t.example", "http://[fd00::1]:7070"}) {
    o.trackers.push_back(http::Url::Parse(u).value());
  }
  o.agent_id = "a1";
  o.udp_announce = udp;
  return o;
}

}  // namespace

TEST_CASE("agent announce urls: UDP for http replicas, HTTPS kept, in each blob's replica order") {
  boost::asio::io_context ioc;
  TrackerClient udp(ioc.get_executor(), Options(true));
  CHECK(udp.AnnounceUrls() == std::vector<std::string>{"udp://10.0.0.5:7070/announce",
                                                       "https://t.example/announce",
                                                       "udp://[fd00::1]:7070/announce"});
  TrackerClient plain(ioc.get_executor(), Options(false));
  CHECK(plain.AnnounceUrls() == std::vector<std::string>{"http://10.0.0.5:7070/announce",
                                                         "https://t.example/announce",
                                                         "http://[fd00::1]:7070/announce"});
  // Per blob: the rendezvous order, the same set, and the replicas map back.
  auto digest = Digest::Parse("sha256:" + std::string(64, 'a')).value();
  std::vector<std::string> ordered = udp.AnnounceUrls(digest);
  std::vector<size_t> order = udp.Order(digest);
  REQUIRE(ordered.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(ordered[i] == udp.AnnounceUrls()[order[i]]);
  CHECK(udp.ReplicasOf(ordered) == order);
}

}  // namespace shoal::agent
