#include "tools/shoalctl/json_call.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "lib/http/client.h"
#include "lib/http/url.h"

namespace shoal::ctl {
namespace asio = boost::asio;

std::string JsonReply::Error() const {
  if (body.is_object() && body.contains("error") && body["error"].is_string())
    return body["error"].get<std::string>();
  return body.dump();
}

Result<JsonReply> JsonCall(const std::string& base_url, boost::beast::http::verb method,
                           const std::string& target, const std::string& body,
                           const std::string& flag, const std::string& bearer) {
  auto url = http::Url::Parse(base_url);
  if (!url) return MakeError(ErrorCode::kInvalidArgument, flag + ": " + url.error().message);
  asio::io_context ioc;
  http::ClientConfig config;
  config.idle_timeout = std::chrono::seconds(60);  // longer than any long-poll we ask for
  http::Client client(ioc.get_executor(), config);
  http::Request req;
  req.method = method;
  req.url = url.value();
  req.url.target = target;
  req.body = body;
  if (!body.empty()) req.headers.set(boost::beast::http::field::content_type, "application/json");
  if (!bearer.empty())
    req.headers.set(boost::beast::http::field::authorization, "Bearer " + bearer);
  Result<JsonReply> out = MakeError(ErrorCode::kInternal, "not run");
  asio::co_spawn(
      ioc,
      [&]() -> asio::awaitable<void> {
        auto res = co_await client.Open(req);
        if (!res) {
          out = res.error();
          co_return;
        }
        auto text = co_await res.value()->ReadAll(64 << 20);
        if (!text) {
          out = text.error();
          co_return;
        }
        auto j = nlohmann::json::parse(text.value(), nullptr, false);
        if (j.is_discarded()) {
          out = MakeError(ErrorCode::kProtocol, base_url + " answered " + target + " with HTTP " +
                                                    std::to_string(res.value()->status()) +
                                                    " and no JSON: " + text.value().substr(0, 200));
          co_return;
        }
        out = JsonReply{res.value()->status(), std::move(j)};
      },
      asio::detached);
  ioc.run();
  return out;
}

std::optional<long long> ParseDuration(const std::string& text) {
  if (text.empty()) return std::nullopt;
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::string unit = text.substr(used);
  long long mult = unit.empty() || unit == "s" ? 1
                   : unit == "m"               ? 60
                   : unit == "h"               ? 3600
                   : unit == "d"               ? 86400
                                               : -1;
  if (mult < 0 || n < 0) return std::nullopt;
  return n * mult;
}

}  // namespace shoal::ctl
