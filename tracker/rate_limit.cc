#include "tracker/rate_limit.h"

#include <algorithm>
#include <chrono>

namespace shoal::tracker {

void RateLimit::Refill(Bucket& b, TimePoint now) const {
  double minutes = std::chrono::duration<double>(now - b.updated).count() / 60.0;
  if (minutes > 0) b.tokens = std::min(per_minute_, b.tokens + minutes * per_minute_);
  b.updated = std::max(b.updated, now);
}

bool RateLimit::Allow(const std::string& key, TimePoint now) {
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    if (buckets_.size() >= max_keys_) {
      // Forget the keys whose buckets are full again: they are as good as new.
      for (auto i = buckets_.begin(); i != buckets_.end();) {
        Refill(i->second, now);
        i = i->second.tokens >= per_minute_ ? buckets_.erase(i) : std::next(i);
      }
      if (buckets_.size() >= max_keys_) return false;
    }
    it = buckets_.emplace(key, Bucket{per_minute_, now}).first;
  }
  Refill(it->second, now);
  if (it->second.tokens < 1.0 - 1e-9) return false;  // refills are sums of fractions
  it->second.tokens -= 1.0;
  return true;
}

}  // namespace shoal::tracker
