#include "tests/support/http_client.h"

#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace shoal::testkit {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

std::string HttpResponse::Header(const std::string& name) const {
  auto it = headers.find(Lower(name));
  return it == headers.end() ? "" : it->second;
}

Result<ParsedUrl> ParseHttpUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    return MakeError(ErrorCode::kInvalidArgument, "not an http:// URL: " + url);
  }
  std::string rest = url.substr(scheme.size());
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  ParsedUrl out;
  out.target = slash == std::string::npos ? "/" : rest.substr(slash);
  size_t colon = authority.rfind(':');
  if (colon == std::string::npos) {
    out.host = authority;
    out.port = "80";
  } else {
    out.host = authority.substr(0, colon);
    out.port = authority.substr(colon + 1);
  }
  if (out.host.empty() || out.port.empty()) {
    return MakeError(ErrorCode::kInvalidArgument, "malformed URL: " + url);
  }
  return out;
}

Result<HttpResponse> HttpRequest(const std::string& method, const std::string& url,
                                 const std::vector<std::pair<std::string, std::string>>& headers,
                                 const std::string& body, std::chrono::milliseconds timeout) {
  auto parsed = ParseHttpUrl(url);
  if (!parsed) return parsed.error();
  const ParsedUrl& u = parsed.value();

  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  beast::flat_buffer buffer;
  http::request<http::string_body> req;
  req.method_string(method);
  req.target(u.target);
  req.version(11);
  req.set(http::field::host, u.host + ":" + u.port);
  req.set(http::field::user_agent, "shoal-testkit");
  for (const auto& [k, v] : headers) req.insert(k, v);
  req.body() = body;
  if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH") {
    req.prepare_payload();
  }
  req.keep_alive(false);

  http::response_parser<http::string_body> parser;
  parser.body_limit(std::uint64_t{1} << 32);
  if (method == "HEAD") parser.skip(true);

  beast::error_code result;
  std::string stage = "resolve";
  stream.expires_after(timeout);
  resolver.async_resolve(u.host, u.port, [&](beast::error_code ec, tcp::resolver::results_type r) {
    if (ec) {
      result = ec;
      return;
    }
    stage = "connect";
    stream.async_connect(r, [&](beast::error_code ec, const tcp::endpoint&) {
      if (ec) {
        result = ec;
        return;
      }
      stage = "write";
      http::async_write(stream, req, [&](beast::error_code ec, size_t) {
        if (ec) {
          result = ec;
          return;
        }
        stage = "read";
        http::async_read(stream, buffer, parser,
                         [&](beast::error_code ec, size_t) { result = ec; });
      });
    });
  });
  // The resolver is not covered by the stream's timer; bound the whole exchange.
  ioc.run_for(timeout + std::chrono::milliseconds(100));
  if (!ioc.stopped()) {
    return MakeError(ErrorCode::kUnavailable, method + " " + url + ": timed out in " + stage);
  }
  if (result) {
    return MakeError(ErrorCode::kUnavailable,
                     method + " " + url + ": " + stage + ": " + result.message());
  }
  HttpResponse out;
  auto& res = parser.get();
  out.status = static_cast<int>(res.result_int());
  for (const auto& f : res) {
    std::string name = Lower(std::string(f.name_string()));
    auto [it, inserted] = out.headers.emplace(name, std::string(f.value()));
    if (!inserted) it->second += ", " + std::string(f.value());
  }
  out.body = std::move(res.body());
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return out;
}

Result<HttpResponse> HttpGet(const std::string& url,
                             const std::vector<std::pair<std::string, std::string>>& headers,
                             std::chrono::milliseconds timeout) {
  return HttpRequest("GET", url, headers, "", timeout);
}

double MetricSum(const std::string& text, const std::string& name,
                 const std::map<std::string, std::string>& labels) {
  double sum = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty() || line[0] == '#') continue;
    size_t name_end = line.find_first_of("{ \t");
    if (name_end == std::string::npos || line.substr(0, name_end) != name) continue;
    std::map<std::string, std::string> found;
    size_t i = name_end;
    if (line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') break;
        std::string key = line.substr(i, eq - i);
        key.erase(0, key.find_first_not_of(" ,"));
        std::string value;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) {
            ++j;
            value += line[j] == 'n' ? '\n' : line[j];
          } else {
            value += line[j];
          }
        }
        found[key] = value;
        i = j + 1;
        while (i < line.size() && (line[i] == ',' || line[i] == ' ')) ++i;
      }
      if (i >= line.size()) continue;
      ++i;  // '}'
    }
    bool match = std::all_of(labels.begin(), labels.end(), [&](const auto& kv) {
      auto it = found.find(kv.first);
      return it != found.end() && it->second == kv.second;
    });
    if (!match) continue;
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    sum += std::strtod(line.c_str() + i, nullptr);
  }
  return sum;
}

}  // namespace shoal::testkit
