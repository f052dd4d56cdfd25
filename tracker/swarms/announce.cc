#include "tracker/swarms/announce.h"

#include <algorithm>
#include <charconv>
#include <unordered_set>

#include "lib/oci/quote.h"

namespace shoal::tracker {
namespace {

Error Invalid(std::string message) {
  return MakeError(ErrorCode::kInvalidArgument, std::move(message));
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A raw (still encoded) key=value pair of the query.
struct Param {
  std::string_view key;
  std::string_view value;
};

// Splits on '&' (empty segments skipped) with the length and count limits applied first, so
// the rest of the parsing is bounded too.
Result<std::vector<Param>> SplitQuery(std::string_view query, std::string_view what) {
  if (query.size() > kMaxQueryBytes) {
    return Invalid(std::string(what) + " query is " + std::to_string(query.size()) +
                   " bytes, more than the limit of " + std::to_string(kMaxQueryBytes));
  }
  std::vector<Param> params;
  params.reserve(16);  // libtorrent sends 12-14
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.empty()) continue;
    if (params.size() == kMaxQueryParams) {
      return Invalid(std::string(what) + " query has more than " + std::to_string(kMaxQueryParams) +
                     " parameters");
    }
    size_t eq = part.find('=');
    if (eq == std::string_view::npos) {
      params.push_back({part, {}});
    } else {
      params.push_back({part.substr(0, eq), part.substr(eq + 1)});
    }
  }
  return params;
}

// Decodes %XX escapes of raw into scratch and returns the decoded bytes: raw itself when it holds
// no escape (no copy), else a view of scratch. One scratch string serves a whole query, so a
// parse allocates once at most instead of once per parameter. Errors as PercentDecode.
Result<std::string_view> Decode(std::string_view raw, std::string_view what,
                                std::string& scratch) {
  size_t pct = raw.find('%');
  if (pct == std::string_view::npos) return raw;
  scratch.assign(raw.substr(0, pct));
  for (size_t i = pct; i < raw.size(); ++i) {
    char c = raw[i];
    if (c != '%') {
      scratch.push_back(c);
      continue;
    }
    if (i + 2 >= raw.size()) {
      return Invalid(std::string(what) + " has a truncated percent-escape at offset " +
                     std::to_string(i));
    }
    int hi = HexValue(raw[i + 1]);
    int lo = HexValue(raw[i + 2]);
    if (hi < 0 || lo < 0) {
      return Invalid(std::string(what) + " has a bad percent-escape " +
                     oci::Quote(raw.substr(i, 3), 3) + " at offset " + std::to_string(i));
    }
    scratch.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return std::string_view(scratch);
}

template <typename Id>
Result<Id> ParseId(std::string_view raw, std::string_view name, std::string& scratch) {
  auto decoded = Decode(raw, name, scratch);
  if (!decoded) return decoded.error();
  auto id = Id::FromBytes(decoded.value());
  if (!id) {
    return Invalid(std::string(name) + " must be " + std::to_string(Id::kSize) +
                   " bytes once decoded, got " + std::to_string(decoded.value().size()));
  }
  return *id;
}

// A non-negative decimal integer no larger than max: digits only, no sign, no spaces.
Result<uint64_t> ParseNumber(std::string_view raw, std::string_view name, uint64_t max,
                             std::string& scratch) {
  auto decoded = Decode(raw, name, scratch);
  if (!decoded) return decoded.error();
  std::string_view text = decoded.value();
  auto shown = [&] { return oci::Quote(text, 32); };
  if (text.empty()) return Invalid(std::string(name) + " is empty");
  if (!std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return Invalid(std::string(name) + " must be a non-negative decimal integer, got " + shown());
  }
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range || value > max) {
    return Invalid(std::string(name) + " " + shown() + " is out of range (at most " +
                   std::to_string(max) + ")");
  }
  if (ec != std::errc() || end != text.data() + text.size()) {
    return Invalid(std::string(name) + " must be a non-negative decimal integer, got " + shown());
  }
  return value;
}

Result<std::string> ParseBoundedString(std::string_view raw, std::string_view name,
                                       std::string& scratch) {
  auto decoded = Decode(raw, name, scratch);
  if (!decoded) return decoded.error();
  if (decoded.value().size() > kMaxKeyBytes) {
    return Invalid(std::string(name) + " is " + std::to_string(decoded.value().size()) +
                   " bytes, more than the limit of " + std::to_string(kMaxKeyBytes));
  }
  return std::string(decoded.value());
}

Result<AnnounceEvent> ParseEvent(std::string_view raw, std::string& scratch) {
  auto decoded = Decode(raw, "event", scratch);
  if (!decoded) return decoded.error();
  std::string_view e = decoded.value();
  if (e.empty() || e == "empty") return AnnounceEvent::kNone;
  if (e == "started") return AnnounceEvent::kStarted;
  if (e == "completed") return AnnounceEvent::kCompleted;
  if (e == "stopped") return AnnounceEvent::kStopped;
  if (e == "paused") return AnnounceEvent::kPaused;
  return Invalid("event " + oci::Quote(e, 32) +
                 " is not one of started, completed, stopped, paused");
}

}  // namespace

std::string_view AnnounceEventName(AnnounceEvent event) {
  switch (event) {
    case AnnounceEvent::kNone:
      return "none";
    case AnnounceEvent::kStarted:
      return "started";
    case AnnounceEvent::kCompleted:
      return "completed";
    case AnnounceEvent::kStopped:
      return "stopped";
    case AnnounceEvent::kPaused:
      return "paused";
  }
  return "none";
}

Result<std::string> PercentDecode(std::string_view text, std::string_view what) {
  std::string scratch;
  auto decoded = Decode(text, what, scratch);
  if (!decoded) return decoded.error();
  return std::string(decoded.value());
}

Result<AnnounceRequest> ParseAnnounceQuery(std::string_view query) {
  auto params = SplitQuery(query, "announce");
  if (!params) return params.error();

  AnnounceRequest req;
  std::string scratch;  // decoded values with escapes; reused by every parameter
  scratch.reserve(kMaxKeyBytes);
  // Which known parameters were seen, to report duplicates and missing ones.
  bool seen_info_hash = false, seen_peer_id = false, seen_port = false, seen_left = false;
  bool seen_uploaded = false, seen_downloaded = false, seen_event = false, seen_numwant = false;
  bool seen_compact = false, seen_key = false, seen_ip = false;
  auto once = [](bool& seen, std::string_view name) -> Status {
    if (seen) return Invalid("announce has " + std::string(name) + " more than once");
    seen = true;
    return Ok();
  };

  for (const Param& p : params.value()) {
    Status status = Ok();
    if (p.key == "info_hash") {
      status = once(seen_info_hash, p.key);
      if (!status) return status.error();
      auto id = ParseId<InfoHash>(p.value, "info_hash", scratch);
      if (!id) return id.error();
      req.info_hash = id.value();
    } else if (p.key == "peer_id") {
      status = once(seen_peer_id, p.key);
      if (!status) return status.error();
      auto id = ParseId<PeerId>(p.value, "peer_id", scratch);
      if (!id) return id.error();
      req.peer_id = id.value();
    } else if (p.key == "port") {
      status = once(seen_port, p.key);
      if (!status) return status.error();
      auto port = ParseNumber(p.value, "port", 65535, scratch);
      if (!port) return port.error();
      if (port.value() == 0) return Invalid("port 0 is not a port a peer can listen on");
      req.port = static_cast<uint16_t>(port.value());
    } else if (p.key == "uploaded") {
      status = once(seen_uploaded, p.key);
      if (!status) return status.error();
      auto n = ParseNumber(p.value, "uploaded", UINT64_MAX, scratch);
      if (!n) return n.error();
      req.uploaded = n.value();
    } else if (p.key == "downloaded") {
      status = once(seen_downloaded, p.key);
      if (!status) return status.error();
      auto n = ParseNumber(p.value, "downloaded", UINT64_MAX, scratch);
      if (!n) return n.error();
      req.downloaded = n.value();
    } else if (p.key == "left") {
      status = once(seen_left, p.key);
      if (!status) return status.error();
      auto n = ParseNumber(p.value, "left", UINT64_MAX, scratch);
      if (!n) return n.error();
      req.left = n.value();
    } else if (p.key == "event") {
      status = once(seen_event, p.key);
      if (!status) return status.error();
      auto event = ParseEvent(p.value, scratch);
      if (!event) return event.error();
      req.event = event.value();
    } else if (p.key == "numwant") {
      status = once(seen_numwant, p.key);
      if (!status) return status.error();
      auto n = ParseNumber(p.value, "numwant", kMaxNumwantParam, scratch);
      if (!n) return n.error();
      req.numwant = static_cast<uint32_t>(n.value());
    } else if (p.key == "compact") {
      status = once(seen_compact, p.key);
      if (!status) return status.error();
      auto n = ParseNumber(p.value, "compact", 1, scratch);
      if (!n) return n.error();
      req.compact = n.value() == 1;
    } else if (p.key == "key") {
      status = once(seen_key, p.key);
      if (!status) return status.error();
      auto key = ParseBoundedString(p.value, "key", scratch);
      if (!key) return key.error();
      req.key = std::move(key.value());
    } else if (p.key == "ip") {
      status = once(seen_ip, p.key);
      if (!status) return status.error();
      auto ip = ParseBoundedString(p.value, "ip", scratch);
      if (!ip) return ip.error();
      req.ip = std::move(ip.value());
    }
  }
  if (!seen_info_hash) return Invalid("announce is missing info_hash");
  if (!seen_peer_id) return Invalid("announce is missing peer_id");
  if (!seen_port) return Invalid("announce is missing port");
  if (!seen_left) return Invalid("announce is missing left");
  return req;
}

Result<std::vector<InfoHash>> ParseScrapeQuery(std::string_view query) {
  auto params = SplitQuery(query, "scrape");
  if (!params) return params.error();
  std::vector<InfoHash> hashes;
  std::unordered_set<InfoHash> seen;
  std::string scratch;
  size_t given = 0;
  for (const Param& p : params.value()) {
    if (p.key != "info_hash") continue;
    if (++given > kMaxScrapeHashes) {
      return Invalid("scrape has more than " + std::to_string(kMaxScrapeHashes) +
                     " info_hash parameters");
    }
    auto id = ParseId<InfoHash>(p.value, "info_hash", scratch);
    if (!id) return id.error();
    if (seen.insert(id.value()).second) hashes.push_back(id.value());
  }
  if (hashes.empty()) {
    return Invalid("scrape needs at least one info_hash (full scrapes are not served)");
  }
  return hashes;
}

}  // namespace shoal::tracker
