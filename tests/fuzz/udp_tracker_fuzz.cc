// Fuzzes the tracker's UDP endpoint (tracker/udp_server.h, UdpServer::Answer over
// tracker/swarms/udp_protocol.h): any datagram from any sender. In the input, "@ID@" at the start
// stands for the sender's valid connection id (8 bytes) and "@KEY@" for a valid announce key, so
// that seeds reach the announce path behind both checks.
//
// Properties: nothing crashes. Without a valid id nothing but a connect's answer (16 bytes for
// 16) is larger than the datagram, so a forged sender cannot amplify. Every answer fits kMaxUdpAnswerBytes and echoes the transaction id;
// an error answer's text is printable. An accepted announce has port != 0 and left < 2^63, and an
// announce answer carries whole 6-byte peers.

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/endian/conversion.hpp>

#include "lib/auth/tokens.h"
#include "tests/fuzz/fuzz_check.h"
#include "tracker/access.h"
#include "tracker/swarms/service.h"
#include "tracker/swarms/udp_protocol.h"
#include "tracker/udp_server.h"

using namespace shoal;
using namespace shoal::tracker;
using boost::asio::ip::udp;

namespace {

constexpr std::string_view kAgentToken = "fuzz-agent-token-0123456789";
std::string g_dir;

struct World {
  prometheus::Registry registry;
  boost::asio::io_context ioc;
  TrackerService service;
  std::optional<Access> access;
  std::optional<UdpServer> server;

  static ServiceOptions Options() {
    ServiceOptions o;
    o.table.limits.max_peers = 64;
    o.table.limits.max_swarms = 16;
    return o;
  }
  World() : service(Options(), registry, 7) {
    auto a = Access::Create({g_dir + "/agent", "", false}, registry);
    FUZZ_CHECK(a.has_value());
    access.emplace(std::move(a.value()));
    server.emplace(ioc, service, *access, registry);
  }
};

uint32_t U32(std::string_view s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return boost::endian::big_to_native(v);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  g_dir = fuzz::MakeTempDir("shoal-fuzz-udp");
  std::ofstream(g_dir + "/agent") << kAgentToken << "\n";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = new World();  // tables grow across inputs, as in a running tracker
  const udp::endpoint from(boost::asio::ip::make_address("198.18.0.7"), 40000);
  const auto now = TrackerClock::now();
  std::string input(reinterpret_cast<const char*>(data), size);
  if (input.starts_with("@ID@")) {
    // The id a connect hands this sender, as the 8 bytes it would echo.
    std::string connect;
    uint64_t magic = boost::endian::native_to_big(kUdpProtocolId);
    connect.append(reinterpret_cast<const char*>(&magic), 8);
    connect.append(8, '\0');
    auto c = world->server->Answer(connect, from, now);
    FUZZ_CHECK(c && c->size() == 16);
    input.replace(0, 4, c->substr(8));
  }
  fuzz::ReplaceAll(input, "@KEY@", auth::AnnounceKey(kAgentToken));
  // Whether the datagram carries an id this cluster issued to the sender, by "@ID@" or because
  // libFuzzer learnt one from the comparisons: such a sender has shown it receives at its address.
  bool with_id = false;
  if (std::optional<UdpHeader> head = PeekUdpHeader(input)) {
    static const UdpConnectionIds ids;  // checks under the agent tokens' keys, as the server does
    with_id = ids.Valid(world->access->agent_secrets(), head->connection_id,
                        PeerEndpoint::FromAddress(from.address(), from.port()),
                        std::chrono::system_clock::now());
  }

  auto parsed = ParseUdpRequest(input);
  std::optional<std::string> out = world->server->Answer(input, from, now);
  if (parsed && parsed.value().action == UdpAction::kAnnounce) {
    FUZZ_CHECK(parsed.value().announce.port != 0);
    FUZZ_CHECK(parsed.value().announce.left < (uint64_t{1} << 63));
  }
  if (!parsed) FUZZ_CHECK(fuzz::IsPrintable(parsed.error().message));
  if (!out) return 0;
  FUZZ_CHECK(out->size() >= 8 && out->size() <= kMaxUdpAnswerBytes);
  FUZZ_CHECK(input.size() >= 16);
  FUZZ_CHECK(U32(*out, 4) == U32(input, 12));  // the transaction id
  const uint32_t action = U32(*out, 0);
  const bool connect = parsed && parsed.value().action == UdpAction::kConnect;
  if (!with_id && !connect) {
    // No id: nothing larger than what was sent (a forged sender cannot amplify).
    FUZZ_CHECK(out->size() <= input.size());
  }
  if (connect) FUZZ_CHECK(action == 0 && out->size() == 16);
  if (action == 3) FUZZ_CHECK(fuzz::IsPrintable(out->substr(8)));
  if (action == 1) {
    FUZZ_CHECK(parsed && parsed.value().action == UdpAction::kAnnounce);
    FUZZ_CHECK(out->size() >= 20 && (out->size() - 20) % 6 == 0);
  }
  if (action == 2) FUZZ_CHECK(out->size() == 8 + 12 * parsed.value().scrape.size());
  FUZZ_CHECK(action <= 3);
  return 0;
}
