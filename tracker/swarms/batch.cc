#include "tracker/swarms/batch.h"

#include <vector>

#include <fmt/format.h>

#include "lib/core/base64.h"

namespace shoal::tracker {

BatchAnswer AnswerAnnounceBatch(TrackerService& service, std::string_view body,
                                const boost::asio::ip::address& remote, TimePoint now) {
  BatchAnswer answer;
  if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
  if (body.empty()) {
    answer.status = 400;
    answer.body = "the batch is empty: send one announce query per line";
    return answer;
  }
  // Split and check every line before applying any, so a malformed batch changes nothing.
  std::vector<std::string_view> queries;
  while (true) {
    size_t nl = body.find('\n');
    std::string_view line = body.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {
      answer.status = 400;
      answer.body = fmt::format("line {} of the batch is empty", queries.size() + 1);
      return answer;
    }
    if (queries.size() == kMaxBatchAnnounces) {
      answer.status = 400;
      answer.body = fmt::format("the batch has more than {} announces", kMaxBatchAnnounces);
      return answer;
    }
    queries.push_back(line);
    if (nl == std::string_view::npos) break;
    body.remove_prefix(nl + 1);
  }
  for (std::string_view query : queries) {
    answer.body += Base64Encode(service.Announce(query, remote, now));
    answer.body += '\n';
  }
  answer.announces = queries.size();
  service.metrics().batched_announces.Increment(static_cast<double>(queries.size()));
  return answer;
}

}  // namespace shoal::tracker
