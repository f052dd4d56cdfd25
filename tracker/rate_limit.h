#pragma once
// A token bucket per key (the tracker keys on a request's TCP source address, which a client
// cannot forge): `per_minute` events a minute, bursts of up to as many. At most max_keys keys
// are kept; beyond, full buckets (idle keys) are forgotten first. Not thread-safe.

#include <cstddef>
#include <string>
#include <unordered_map>

#include "tracker/swarms/swarm_table.h"

namespace shoal::tracker {

class RateLimit {
 public:
  explicit RateLimit(double per_minute, size_t max_keys = 100'000)
      : per_minute_(per_minute), max_keys_(max_keys) {}

  // Whether key may do one more event now (and, if so, counts it).
  bool Allow(const std::string& key, TimePoint now);

 private:
  struct Bucket {
    double tokens = 0;
    TimePoint updated;
  };
  void Refill(Bucket& b, TimePoint now) const;

  double per_minute_;
  size_t max_keys_;
  std::unordered_map<std::string, Bucket> buckets_;
};

}  // namespace shoal::tracker
