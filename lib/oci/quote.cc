#include "lib/oci/quote.h"

namespace shoal::oci {
namespace {

std::string Escape(std::string_view text, size_t max_bytes, bool escape_quotes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  size_t n = text.size() < max_bytes ? text.size() : max_bytes;
  for (size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (escape_quotes && (c == '"' || c == '\\')) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (n < text.size()) out += "...";
  return out;
}

}  // namespace

std::string Quote(std::string_view text, size_t max_bytes) {
  return "\"" + Escape(text, max_bytes, /*escape_quotes=*/true) + "\"";
}

std::string Printable(std::string_view text, size_t max_bytes) {
  return Escape(text, max_bytes, /*escape_quotes=*/false);
}

}  // namespace shoal::oci
