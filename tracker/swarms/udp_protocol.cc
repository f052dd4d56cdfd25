#include "tracker/swarms/udp_protocol.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <boost/endian/conversion.hpp>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace shoal::tracker {
namespace {

// Reads big-endian integers off the front of a datagram, never past its end.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool Has(size_t n) const { return data_.size() - pos_ >= n; }
  size_t left() const { return data_.size() - pos_; }
  template <typename T>
  T Read() {
    T v;
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return boost::endian::big_to_native(v);
  }
  std::string_view Bytes(size_t n) {
    std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

template <typename T>
void Put(std::string& out, T v) {
  v = boost::endian::native_to_big(v);
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

Error Invalid(std::string message) {
  return MakeError(ErrorCode::kInvalidArgument, std::move(message));
}

// An announce's fixed part after the 16-byte header: info_hash 20, peer_id 20, downloaded 8,
// left 8, uploaded 8, event 4, ip 4, key 4, num_want 4, port 2.
constexpr size_t kAnnounceFixed = 82;

Result<AnnounceEvent> EventOf(uint32_t event) {
  switch (event) {
    case 0: return AnnounceEvent::kNone;
    case 1: return AnnounceEvent::kCompleted;
    case 2: return AnnounceEvent::kStarted;
    case 3: return AnnounceEvent::kStopped;
    default: break;
  }
  return Invalid("announce event " + std::to_string(event) + " is not 0-3");
}

// BEP 41 options after an announce's fixed part: 0 ends them, 1 is padding, 2 carries URL data
// (a length byte, then that many bytes; several are concatenated). Unknown types cannot be
// skipped (their length is unknown), so they end the parse with an error.
Status ParseOptions(Reader& r, std::string& url_data) {
  while (r.Has(1)) {
    auto type = r.Read<uint8_t>();
    if (type == 0) return Ok();
    if (type == 1) continue;
    if (type != 2) return Invalid("announce option type " + std::to_string(type) + " is unknown");
    if (!r.Has(1)) return Invalid("announce URL data option is missing its length");
    auto n = r.Read<uint8_t>();
    if (!r.Has(n)) {
      return Invalid("announce URL data option says " + std::to_string(n) + " bytes, " +
                     std::to_string(r.left()) + " follow");
    }
    url_data.append(r.Bytes(n));
  }
  return Ok();
}

}  // namespace

std::string_view UdpActionName(UdpAction action) {
  switch (action) {
    case UdpAction::kConnect: return "connect";
    case UdpAction::kAnnounce: return "announce";
    case UdpAction::kScrape: return "scrape";
    case UdpAction::kError: return "error";
  }
  return "error";
}

std::optional<UdpHeader> PeekUdpHeader(std::string_view datagram) {
  Reader r(datagram);
  if (!r.Has(16)) return std::nullopt;
  UdpHeader h;
  h.connection_id = r.Read<uint64_t>();
  r.Read<uint32_t>();  // the action
  h.transaction_id = r.Read<uint32_t>();
  return h;
}

Result<UdpRequest> ParseUdpRequest(std::string_view datagram) {
  Reader r(datagram);
  if (!r.Has(16)) {
    return Invalid("datagram of " + std::to_string(datagram.size()) +
                   " bytes is shorter than a request header (16)");
  }
  UdpRequest req;
  req.connection_id = r.Read<uint64_t>();
  const auto action = r.Read<uint32_t>();
  req.transaction_id = r.Read<uint32_t>();
  switch (action) {
    case 0:
      if (req.connection_id != kUdpProtocolId) return Invalid("connect without BEP 15's protocol id");
      req.action = UdpAction::kConnect;
      req.connection_id = 0;
      return req;
    case 1: break;
    case 2: {
      req.action = UdpAction::kScrape;
      if (r.left() == 0 || r.left() % InfoHash::kSize != 0) {
        return Invalid("scrape of " + std::to_string(r.left()) +
                       " bytes is not a whole number of info-hashes");
      }
      if (r.left() / InfoHash::kSize > kMaxUdpScrapeHashes) {
        return Invalid("scrape of more than " + std::to_string(kMaxUdpScrapeHashes) +
                       " info-hashes");
      }
      while (r.Has(InfoHash::kSize)) req.scrape.push_back(*InfoHash::FromBytes(r.Bytes(20)));
      return req;
    }
    default:
      return Invalid("action " + std::to_string(action) + " is not connect, announce or scrape");
  }
  req.action = UdpAction::kAnnounce;
  if (!r.Has(kAnnounceFixed)) {
    return Invalid("announce of " + std::to_string(datagram.size()) + " bytes is shorter than " +
                   std::to_string(16 + kAnnounceFixed));
  }
  AnnounceRequest& a = req.announce;
  a.info_hash = *InfoHash::FromBytes(r.Bytes(20));
  a.peer_id = *PeerId::FromBytes(r.Bytes(20));
  a.downloaded = r.Read<uint64_t>();
  const auto left = r.Read<uint64_t>();
  if (left >> 63) return Invalid("announce left is negative");
  a.left = left;
  a.uploaded = r.Read<uint64_t>();
  auto event = EventOf(r.Read<uint32_t>());
  if (!event) return event.error();
  a.event = event.value();
  const auto ip = r.Read<uint32_t>();
  if (ip != 0) {
    a.ip = std::to_string(ip >> 24) + "." + std::to_string((ip >> 16) & 255) + "." +
           std::to_string((ip >> 8) & 255) + "." + std::to_string(ip & 255);
  }
  const auto key = r.Read<uint32_t>();
  a.key = std::to_string(key);
  const auto num_want = static_cast<int32_t>(r.Read<uint32_t>());
  if (num_want >= 0) a.numwant = std::min<uint32_t>(num_want, kMaxNumwantParam);
  a.port = r.Read<uint16_t>();
  if (a.port == 0) return Invalid("announce port is 0");
  if (Status options = ParseOptions(r, req.url_data); !options) return options.error();
  return req;
}

std::string EncodeUdpConnect(uint32_t transaction_id, uint64_t connection_id) {
  std::string out;
  Put<uint32_t>(out, 0);
  Put<uint32_t>(out, transaction_id);
  Put<uint64_t>(out, connection_id);
  return out;
}

std::string EncodeUdpAnnounce(uint32_t transaction_id, const AnnounceReply& reply,
                              std::chrono::seconds interval, bool v6, size_t max_bytes) {
  max_bytes = std::min(max_bytes, kMaxUdpAnswerBytes);
  std::string out;
  Put<uint32_t>(out, 1);
  Put<uint32_t>(out, transaction_id);
  Put<uint32_t>(out, static_cast<uint32_t>(std::max<int64_t>(0, interval.count())));
  Put<uint32_t>(out, reply.counts.incomplete);
  Put<uint32_t>(out, reply.counts.complete);
  const size_t each = v6 ? 18 : 6;
  for (const PeerEndpoint& p : reply.peers) {
    if (p.is_v6() != v6) continue;
    if (out.size() + each > max_bytes) break;
    p.AppendCompact(out);
  }
  return out;
}

std::string EncodeUdpScrape(uint32_t transaction_id, const std::vector<SwarmCounts>& counts) {
  std::string out;
  Put<uint32_t>(out, 2);
  Put<uint32_t>(out, transaction_id);
  for (const SwarmCounts& c : counts) {
    Put<uint32_t>(out, c.complete);
    Put<uint32_t>(out, static_cast<uint32_t>(std::min<uint64_t>(c.downloaded, UINT32_MAX)));
    Put<uint32_t>(out, c.incomplete);
  }
  return out;
}

std::string EncodeUdpError(uint32_t transaction_id, std::string_view message, size_t max_bytes) {
  max_bytes = std::clamp<size_t>(max_bytes, 8, kMaxUdpAnswerBytes);
  std::string out;
  Put<uint32_t>(out, 3);
  Put<uint32_t>(out, transaction_id);
  out.append(message.substr(0, max_bytes - out.size()));
  return out;
}

UdpConnectionIds::UdpConnectionIds() {
  if (RAND_bytes(own_.data(), static_cast<int>(own_.size())) != 1) {
    // Without randomness every open tracker would issue the same ids; refuse to run like that.
    throw std::runtime_error("RAND_bytes failed: cannot make a UDP connection-id key");
  }
}

uint64_t UdpConnectionIds::Mac(const UdpSecret& key, const PeerEndpoint& from, int64_t minute) {
  std::string input;
  Put<uint64_t>(input, static_cast<uint64_t>(minute));
  from.AppendCompact(input);
  input.resize(input.size() - 2);  // the address only
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac, &len);
  uint64_t id = 0;
  std::memcpy(&id, mac, sizeof(id));
  return id;
}

namespace {
int64_t MinuteOf(std::chrono::system_clock::time_point now) {
  return std::chrono::duration_cast<std::chrono::minutes>(now.time_since_epoch()).count();
}
}  // namespace

uint64_t UdpConnectionIds::Issue(std::span<const UdpSecret> secrets, const PeerEndpoint& from,
                                 std::chrono::system_clock::time_point now) const {
  return Mac(secrets.empty() ? own_ : secrets.front(), from, MinuteOf(now));
}

bool UdpConnectionIds::Valid(std::span<const UdpSecret> secrets, uint64_t id,
                             const PeerEndpoint& from,
                             std::chrono::system_clock::time_point now) const {
  const int64_t minute = MinuteOf(now);
  auto matches = [&](const UdpSecret& key) {
    return id == Mac(key, from, minute) || id == Mac(key, from, minute - 1) ||
           id == Mac(key, from, minute + 1);
  };
  if (secrets.empty()) return matches(own_);
  return std::any_of(secrets.begin(), secrets.end(), matches);
}

}  // namespace shoal::tracker
