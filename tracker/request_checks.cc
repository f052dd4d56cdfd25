#include "tracker/request_checks.h"

#include <algorithm>

#include <fmt/format.h>

#include "lib/oci/quote.h"
#include "tracker/swarms/announce.h"

namespace shoal::tracker {
using nlohmann::json;

std::string Quoted(std::string_view text) { return oci::Quote(text, 80); }

std::optional<uint64_t> ParseDecimal(std::string_view text, size_t max_digits) {
  if (text.empty() || text.size() > max_digits) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

// Splits "a=1&b=2" into decoded pairs; a parameter given twice is an error.
std::optional<Rejection> ParseQuery(std::string_view query,
                                    std::map<std::string, std::string>& out) {
  if (query.size() > kMaxQueryBytes) {
    return Rejection{400, "query is " + std::to_string(query.size()) +
                              " bytes, more than the limit of " + std::to_string(kMaxQueryBytes)};
  }
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.empty()) continue;
    size_t eq = part.find('=');
    std::string_view raw_key = part.substr(0, eq);
    std::string_view raw_value =
        eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1);
    auto key = PercentDecode(raw_key, "query parameter name");
    if (!key) return Rejection{400, key.error().message};
    auto value = PercentDecode(raw_value, key.value());
    if (!value) return Rejection{400, value.error().message};
    if (!out.emplace(key.value(), std::move(value.value())).second) {
      return Rejection{400, "query parameter " + Quoted(key.value()) + " is given twice"};
    }
  }
  return std::nullopt;
}

bool HasControlChars(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

std::optional<Rejection> CheckId(std::string_view what, std::string_view value, size_t max) {
  if (value.empty() || value.size() > max || HasControlChars(value)) {
    return Rejection{400, std::string(what) + " must be a non-empty string of at most " +
                              std::to_string(max) + " printable characters"};
  }
  return std::nullopt;
}

std::optional<Rejection> Body::Parse(std::string_view text, Body& out) {
  if (text.empty()) return Rejection{400, "request body is empty; a JSON object is required"};
  try {
    out.json_ = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e999
    return Rejection{400, std::string("request body is not valid JSON: ") + e.what()};
  }
  if (!out.json_.is_object()) return Rejection{400, "request body is not a JSON object"};
  return std::nullopt;
}

std::optional<Rejection> Body::String(const char* name, bool required, size_t max,
                                      std::string& out) const {
  auto it = json_.find(name);
  if (it == json_.end() || it->is_null()) {
    if (!required) return std::nullopt;
    return Rejection{400, std::string("request body has no \"") + name + "\" field"};
  }
  if (!it->is_string()) {
    return Rejection{400, std::string("\"") + name + "\" must be a string"};
  }
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > max) {
    return Rejection{400,
                     fmt::format("\"{}\" is {} bytes long, more than {}", name, s.size(), max)};
  }
  out = s;
  return std::nullopt;
}

std::optional<Rejection> Body::Unsigned(const char* name, uint64_t& out) const {
  auto it = json_.find(name);
  if (it == json_.end() || it->is_null()) {
    return Rejection{400, std::string("request body has no \"") + name + "\" field"};
  }
  if (it->is_number_unsigned()) {
    out = it->get<uint64_t>();
    return std::nullopt;
  }
  if (it->is_number_integer() && it->get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(it->get<int64_t>());
    return std::nullopt;
  }
  return Rejection{400, std::string("\"") + name + "\" must be a non-negative integer"};
}

const json* Body::Find(const char* name) const {
  auto it = json_.find(name);
  return it == json_.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace shoal::tracker
