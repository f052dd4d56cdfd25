#pragma once
// A tiny blocking HTTP/1.1 client (plain http:// only) for tests: probe endpoints, read
// /metrics, send hand-made registry requests.

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/error.h"

namespace shoal::testkit {

// A complete response. Header names are stored lower-case.
struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // repeated headers joined with ", "
  std::string body;

  // The header's value (name case-insensitive), "" if absent.
  std::string Header(const std::string& name) const;
};

// Sends one request on a fresh connection and reads the whole response. `url` is
// "http://host:port/path?query". HEAD responses have an empty body. Errors: kInvalidArgument for
// a URL it cannot parse, kUnavailable for connect/read/write failures or the timeout.
Result<HttpResponse> HttpRequest(
    const std::string& method, const std::string& url,
    const std::vector<std::pair<std::string, std::string>>& headers = {},
    const std::string& body = "", std::chrono::milliseconds timeout = std::chrono::seconds(30));

// HttpRequest("GET", ...).
Result<HttpResponse> HttpGet(const std::string& url,
                             const std::vector<std::pair<std::string, std::string>>& headers = {},
                             std::chrono::milliseconds timeout = std::chrono::seconds(30));

// Sum of every sample of Prometheus metric `name` in `text` (text exposition format) whose
// labels include all of `labels` (e.g. {{"source", "cache"}}). 0 if none matches.
double MetricSum(const std::string& text, const std::string& name,
                 const std::map<std::string, std::string>& labels = {});

// Splits "http://host:port/target" into host, port (default 80) and target ("/" if empty).
// Errors: kInvalidArgument.
struct ParsedUrl {
  std::string host;
  std::string port;
  std::string target;
};
Result<ParsedUrl> ParseHttpUrl(const std::string& url);

}  // namespace shoal::testkit
