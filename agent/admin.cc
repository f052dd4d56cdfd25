#include "agent/admin.h"

#include <string_view>

namespace shoal::agent {

namespace {

std::optional<std::string> PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%') {
      auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
      };
      if (i + 2 >= s.size()) return std::nullopt;
      int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::string AdminTarget::Param(const std::string& key, std::string dflt) const {
  auto it = params.find(key);
  return it == params.end() ? dflt : it->second;
}

const std::vector<std::string>& AdminTarget::List(const std::string& key) const {
  static const std::vector<std::string> kNone;
  auto it = lists.find(key);
  return it == lists.end() ? kNone : it->second;
}

std::optional<AdminTarget> ParseAdminTarget(const std::string& target) {
  AdminTarget t;
  auto q = target.find('?');
  t.path = target.substr(0, q);
  if (q == std::string::npos) return t;
  std::string_view query(target);
  query.remove_prefix(q + 1);
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    auto eq = pair.find('=');
    auto key = PercentDecode(pair.substr(0, eq));
    auto value = PercentDecode(eq == std::string_view::npos ? "" : pair.substr(eq + 1));
    if (!key || !value) return std::nullopt;
    t.lists[*key].push_back(*value);
    t.params[*key] = *value;
  }
  return t;
}

shim::AdminReply JsonReply(unsigned status, const nlohmann::json& body) {
  return shim::AdminReply{status, body.dump(2) + "\n"};
}

shim::AdminReply ErrorReply(const Error& e) {
  unsigned status = e.code == ErrorCode::kNotFound || e.code == ErrorCode::kRefused ? 404
                    : e.code == ErrorCode::kInvalidArgument                         ? 400
                    : e.code == ErrorCode::kUnavailable                             ? 503
                                                                                    : 500;
  return JsonReply(status, {{"error", e.ToString()}});
}

int64_t UnixMs(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

}  // namespace shoal::agent
