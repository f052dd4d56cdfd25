#include "registry-shim/link.h"

#include "lib/http/url.h"

namespace shoal::shim {
namespace {

// The query of a URI reference ("" when it has none), without any fragment.
std::string_view QueryOf(std::string_view uri) {
  uri = uri.substr(0, uri.find('#'));
  auto q = uri.find('?');
  return q == std::string_view::npos ? std::string_view() : uri.substr(q + 1);
}

// True for characters that may stand in a query as sent on: no CTLs, spaces, quotes or "<>".
bool SafeQuery(std::string_view q) {
  for (char c : q) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f || c == '"' || c == '<' || c == '>' || c == '\\') return false;
  }
  return true;
}

}  // namespace

std::optional<std::string> RewriteLink(std::string_view upstream_link, std::string_view client_path,
                                       const std::optional<std::string>& ns) {
  std::string out;
  std::string_view rest = upstream_link;
  while (true) {
    auto open = rest.find('<');
    if (open == std::string_view::npos) break;
    auto close = rest.find('>', open + 1);
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view uri = rest.substr(open + 1, close - open - 1);
    // Parameters run to the next link, i.e. to the next "," outside quotes.
    size_t end = close + 1;
    bool quoted = false;
    while (end < rest.size() && (quoted || rest[end] != ',')) {
      if (rest[end] == '"') quoted = !quoted;
      ++end;
    }
    std::string_view params = rest.substr(close + 1, end - close - 1);
    std::string_view query = QueryOf(uri);
    if (!SafeQuery(query)) return std::nullopt;
    std::string target(client_path);
    std::string q(query);
    if (ns && !ns->empty()) q += std::string(q.empty() ? "" : "&") + "ns=" + http::QueryEscape(*ns);
    if (!q.empty()) target += "?" + q;
    if (!out.empty()) out += ", ";
    out += "<" + target + ">";
    // Without the spaces around the parameters, for a canonical form.
    while (!params.empty() && (params.front() == ' ' || params.front() == '\t')) {
      params.remove_prefix(1);
    }
    while (!params.empty() && (params.back() == ' ' || params.back() == '\t'))
      params.remove_suffix(1);
    out += std::string(params);
    if (end >= rest.size()) break;
    rest = rest.substr(end + 1);
  }
  if (out.empty()) return std::nullopt;
  return out;
}

}  // namespace shoal::shim
