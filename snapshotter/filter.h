#pragma once
// containerd's filter expressions (its filters package) for snapshot listings:
// `selector[,selector...]`, each `fieldpath`, `fieldpath==value`, `fieldpath!=value` or
// `fieldpath~=regexp`, over the fields containerd's snapshot adaptor knows: kind, name, parent
// and labels.<key>. Values and fields may be "quoted" (Go escapes \" and \\).

#include <regex>
#include <string>
#include <vector>

#include "snapshotter/store.h"

namespace shoal::snapshotter {

// One parsed expression: every selector must match (containerd's "and" within one filter).
class Filter {
 public:
  // Errors: kInvalidArgument naming the expression and what is wrong with it.
  static StoreResult<Filter> Parse(const std::string& text);
  // Whether info satisfies every selector.
  bool Matches(const Info& info) const;

 private:
  enum class Op { kPresent, kEqual, kNotEqual, kMatches };
  struct Selector {
    std::vector<std::string> fieldpath;
    Op op = Op::kPresent;
    std::string value;
    std::regex re;  // for kMatches
  };
  std::vector<Selector> selectors_;
};

// containerd's "or" across filters: whether any of them matches info.
bool MatchesAny(const std::vector<Filter>& filters, const Info& info);

}  // namespace shoal::snapshotter
