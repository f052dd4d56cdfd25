#include "snapshotter/filter.h"

#include <cctype>

namespace shoal::snapshotter {
namespace {

StoreError Bad(const std::string& text, const std::string& why) {
  return StoreError{Errc::kInvalidArgument, "filter \"" + text + "\": " + why};
}

// A tiny scanner over one expression; positions are byte offsets.
struct Scanner {
  const std::string& s;
  size_t pos = 0;

  void SkipSpace() {
    while (pos < s.size() && std::isspace(static_cast<unsigned char>(s[pos]))) ++pos;
  }
  bool AtEnd() {
    SkipSpace();
    return pos >= s.size();
  }
  // A "quoted" string with \" and \\ (and \n, \t) escapes; false if unterminated.
  bool Quoted(std::string* out) {
    ++pos;  // opening quote
    while (pos < s.size()) {
      char c = s[pos++];
      if (c == '"') return true;
      if (c == '\\' && pos < s.size()) {
        char e = s[pos++];
        *out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
        continue;
      }
      *out += c;
    }
    return false;
  }
  // A field: quoted, or letters, digits and '_' (containerd also allows '-' inside labels
  // only when quoted).
  bool Field(std::string* out) {
    SkipSpace();
    if (pos < s.size() && s[pos] == '"') return Quoted(out);
    size_t start = pos;
    while (pos < s.size() &&
           (std::isalnum(static_cast<unsigned char>(s[pos])) || s[pos] == '_')) {
      ++pos;
    }
    *out = s.substr(start, pos - start);
    return !out->empty();
  }
  // A value: quoted, or everything up to a ',' or whitespace.
  bool Value(std::string* out) {
    SkipSpace();
    if (pos < s.size() && s[pos] == '"') return Quoted(out);
    size_t start = pos;
    while (pos < s.size() && s[pos] != ',' &&
           !std::isspace(static_cast<unsigned char>(s[pos]))) {
      ++pos;
    }
    *out = s.substr(start, pos - start);
    return !out->empty();
  }
};

// containerd's snapshot adaptor (snapshots/storage/bolt.go, adaptSnapshot).
bool Field(const Info& info, const std::vector<std::string>& path, std::string* value) {
  if (path.empty()) return false;
  const std::string& f = path[0];
  if (f == "kind") {
    *value = KindName(info.kind);
    return true;
  }
  if (f == "name") {
    *value = info.name;
    return true;
  }
  if (f == "parent") {
    *value = info.parent;
    return true;
  }
  if (f == "labels") {
    if (info.labels.empty()) return false;
    std::string key;
    for (size_t i = 1; i < path.size(); ++i) key += (i > 1 ? "." : "") + path[i];
    auto it = info.labels.find(key);
    if (it == info.labels.end()) return false;
    *value = it->second;
    return true;
  }
  return false;
}

}  // namespace

StoreResult<Filter> Filter::Parse(const std::string& text) {
  Filter filter;
  Scanner sc{text};
  if (sc.AtEnd()) return Bad(text, "empty");
  for (;;) {
    Selector sel;
    for (;;) {
      std::string f;
      if (!sc.Field(&f)) return Bad(text, "expected a field at byte " + std::to_string(sc.pos));
      sel.fieldpath.push_back(std::move(f));
      if (sc.pos < text.size() && text[sc.pos] == '.') {
        ++sc.pos;
        continue;
      }
      break;
    }
    sc.SkipSpace();
    auto two = text.substr(sc.pos, 2);
    if (two == "==" || two == "!=" || two == "~=") {
      sel.op = two == "==" ? Op::kEqual : two == "!=" ? Op::kNotEqual : Op::kMatches;
      sc.pos += 2;
      if (!sc.Value(&sel.value)) {
        return Bad(text, "expected a value at byte " + std::to_string(sc.pos));
      }
      if (sel.op == Op::kMatches) {
        try {
          sel.re = std::regex(sel.value, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
          return Bad(text, "bad regular expression \"" + sel.value + "\": " + e.what());
        }
      }
    }
    filter.selectors_.push_back(std::move(sel));
    if (sc.AtEnd()) break;
    if (text[sc.pos] != ',') {
      return Bad(text, "expected ',' or the end at byte " + std::to_string(sc.pos));
    }
    ++sc.pos;
  }
  return filter;
}

bool Filter::Matches(const Info& info) const {
  for (const Selector& sel : selectors_) {
    std::string value;
    bool present = Field(info, sel.fieldpath, &value);
    bool ok = false;
    switch (sel.op) {
      case Op::kPresent: ok = present; break;
      case Op::kEqual: ok = present && value == sel.value; break;
      case Op::kNotEqual: ok = value != sel.value; break;
      case Op::kMatches: ok = std::regex_search(value, sel.re); break;
    }
    if (!ok) return false;
  }
  return true;
}

bool MatchesAny(const std::vector<Filter>& filters, const Info& info) {
  for (const Filter& f : filters)
    if (f.Matches(info)) return true;
  return false;
}

}  // namespace shoal::snapshotter
