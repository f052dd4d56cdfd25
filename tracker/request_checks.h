#pragma once
// Validation shared by the tracker's JSON APIs (blob API, prefetch API): query parsing, ids and
// typed access to JSON request bodies. Every failure is a Rejection whose message names the bad
// part, so a malformed request gets a precise 400 and never a 500.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace shoal::tracker {

// A request that cannot be served, with the status it gets.
struct Rejection {
  unsigned status = 400;
  std::string message;
  std::string_view allow;  // for 405: the methods the path takes
};

// text quoted and shortened for an error message.
std::string Quoted(std::string_view text);
// A decimal of at most max_digits digits, or nullopt.
std::optional<uint64_t> ParseDecimal(std::string_view text, size_t max_digits);
// Splits "a=1&b=2" into decoded pairs; a parameter given twice, or a query longer than
// kMaxQueryBytes (tracker/swarms/announce.h), is an error.
std::optional<Rejection> ParseQuery(std::string_view query,
                                    std::map<std::string, std::string>& out);
// Whether s holds ASCII control characters.
bool HasControlChars(std::string_view s);
// Rejects an empty, overlong or non-printable identifier, naming it as `what`.
std::optional<Rejection> CheckId(std::string_view what, std::string_view value, size_t max);

// Typed access to the fields of a JSON request body; every failure names the field.
class Body {
 public:
  // Parses text, which must be a JSON object.
  static std::optional<Rejection> Parse(std::string_view text, Body& out);

  // A string field of at most max bytes; absent is fine unless required (out unchanged).
  std::optional<Rejection> String(const char* name, bool required, size_t max,
                                  std::string& out) const;
  // A required non-negative integer field.
  std::optional<Rejection> Unsigned(const char* name, uint64_t& out) const;
  // The raw field, or null when absent.
  const nlohmann::json* Find(const char* name) const;

 private:
  nlohmann::json json_;
};

}  // namespace shoal::tracker
