// Reading and editing containerd's config.toml for the agent's snapshotter (see the header).
#include "tools/shoalctl/containerd_toml.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace shoal::ctl {
namespace {

constexpr char kBegin[] =
    "# shoal-node-setup: begin (the shoal agent's containerd snapshotter; `shoalctl node-setup "
    "--cleanup` removes this block)";
constexpr char kEnd[] = "# shoal-node-setup: end";
constexpr char kWas[] = "  # shoal-node-setup: was: ";
constexpr char kAdded[] = "  # shoal-node-setup: added";

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) {
      out.push_back(text.substr(pos));
      return out;
    }
    out.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
}

std::string JoinLines(const std::vector<std::string>& lines) {
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    out += lines[i];
  }
  return out;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::string LeadingSpace(const std::string& s) { return s.substr(0, s.find_first_not_of(" \t")); }

bool StartsWith(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

// Whether `path` is `section` or inside it.
bool Under(const std::string& path, const std::string& section) {
  return path == section || StartsWith(path, section + ".");
}

// Where a scan of values stands at the end of a line.
struct ValueState {
  bool in_basic_ml = false;    // inside """..."""
  bool in_literal_ml = false;  // inside '''...'''
  int depth = 0;               // open [ and { of arrays and inline tables
  bool Open() const { return in_basic_ml || in_literal_ml || depth > 0; }
};

// Scans s[from..] as (part of) a value, updating `st`; returns where a comment starts, or npos.
size_t ScanValue(const std::string& s, size_t from, ValueState& st) {
  size_t i = from;
  while (i < s.size()) {
    if (st.in_basic_ml) {
      if (s[i] == '\\') {
        i += 2;
      } else if (s.compare(i, 3, "\"\"\"") == 0) {
        st.in_basic_ml = false;
        i += 3;
      } else {
        ++i;
      }
      continue;
    }
    if (st.in_literal_ml) {
      if (s.compare(i, 3, "'''") == 0) {
        st.in_literal_ml = false;
        i += 3;
      } else {
        ++i;
      }
      continue;
    }
    char c = s[i];
    if (c == '#') return i;
    if (s.compare(i, 3, "\"\"\"") == 0) {
      st.in_basic_ml = true;
      i += 3;
    } else if (s.compare(i, 3, "'''") == 0) {
      st.in_literal_ml = true;
      i += 3;
    } else if (c == '"') {
      ++i;
      while (i < s.size() && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
      ++i;
    } else if (c == '\'') {
      i = s.find('\'', i + 1);
      if (i == std::string::npos) return std::string::npos;
      ++i;
    } else {
      if (c == '[' || c == '{') ++st.depth;
      if ((c == ']' || c == '}') && st.depth > 0) --st.depth;
      ++i;
    }
  }
  return std::string::npos;
}

// The position of `stop` in s (from `from`) outside quoted parts of a key; npos if none.
size_t FindInKey(const std::string& s, size_t from, char stop) {
  for (size_t i = from; i < s.size(); ++i) {
    if (s[i] == '"') {
      ++i;
      while (i < s.size() && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
    } else if (s[i] == '\'') {
      i = s.find('\'', i + 1);
      if (i == std::string::npos) return i;
    } else if (s[i] == stop) {
      return i;
    }
  }
  return std::string::npos;
}

bool BareKey(const std::string& k) {
  return !k.empty() && std::all_of(k.begin(), k.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '-';
  });
}

// A dotted key or table name with quotes only where TOML needs them.
std::string NormalizeKey(const std::string& raw) {
  std::string out;
  size_t pos = 0;
  while (pos <= raw.size()) {
    size_t dot = FindInKey(raw, pos, '.');
    std::string part =
        Trim(raw.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos));
    if (part.size() >= 2 && (part[0] == '"' || part[0] == '\'')) {
      part = TomlString(part).value_or(part);
      if (!BareKey(part)) part = "\"" + part + "\"";
    }
    out += (out.empty() ? "" : ".") + part;
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return out;
}

// A TOML basic string of `s`.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::vector<TomlLine> ScanToml(const std::string& text) {
  std::vector<TomlLine> out;
  ValueState st;
  std::string table;
  for (std::string& raw : SplitLines(text)) {
    TomlLine l;
    l.text = std::move(raw);
    if (st.Open()) {
      l.kind = TomlLine::Kind::kContinuation;
      ScanValue(l.text, 0, st);
      out.push_back(std::move(l));
      continue;
    }
    std::string t = Trim(l.text);
    if (t.empty() || t[0] == '#') {
      out.push_back(std::move(l));
      continue;
    }
    if (StartsWith(t, "[[")) {
      size_t close = FindInKey(t, 2, ']');
      if (close != std::string::npos) {
        l.kind = TomlLine::Kind::kArrayTable;
        l.path = NormalizeKey(t.substr(2, close - 2));
        table = l.path;
      }
    } else if (t[0] == '[') {
      size_t close = FindInKey(t, 1, ']');
      if (close != std::string::npos) {
        l.kind = TomlLine::Kind::kTable;
        l.path = NormalizeKey(t.substr(1, close - 1));
        table = l.path;
      }
    } else {
      size_t eq = FindInKey(l.text, 0, '=');
      if (eq != std::string::npos) {
        l.kind = TomlLine::Kind::kKey;
        std::string key = NormalizeKey(l.text.substr(0, eq));
        l.path = table.empty() ? key : table + "." + key;
        size_t comment = ScanValue(l.text, eq + 1, st);
        l.value = Trim(l.text.substr(
            eq + 1, comment == std::string::npos ? std::string::npos : comment - eq - 1));
        l.multiline = st.Open();
      }
    }
    out.push_back(std::move(l));
  }
  return out;
}

std::optional<std::string> TomlString(const std::string& value) {
  if (value.size() < 2) return std::nullopt;
  if (value.front() == '\'' && value.back() == '\'' && !StartsWith(value, "'''")) {
    return value.substr(1, value.size() - 2);
  }
  if (value.front() != '"' || value.back() != '"' || StartsWith(value, "\"\"\"")) {
    return std::nullopt;
  }
  std::string out;
  for (size_t i = 1; i + 1 < value.size(); ++i) {
    char c = value[i];
    if (c == '\\' && i + 2 < value.size()) {
      char n = value[++i];
      out += n == 'n' ? '\n' : n == 't' ? '\t' : n;
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<bool> TomlBool(const std::string& value) {
  if (value == "true") return true;
  if (value == "false") return false;
  return std::nullopt;
}

std::vector<std::string> TomlStrings(const std::vector<TomlLine>& lines, size_t i) {
  std::string all = lines.at(i).value;
  for (size_t j = i + 1; j < lines.size() && lines[j].kind == TomlLine::Kind::kContinuation; ++j) {
    ValueState st;
    size_t comment = ScanValue(lines[j].text, 0, st);
    all += " " + lines[j].text.substr(0, comment);
  }
  std::vector<std::string> out;
  for (size_t p = 0; p < all.size(); ++p) {
    char q = all[p];
    if (q != '"' && q != '\'') continue;
    size_t end = p + 1;
    while (end < all.size() && all[end] != q) end += (q == '"' && all[end] == '\\') ? 2 : 1;
    if (end >= all.size()) break;
    if (auto s = TomlString(all.substr(p, end - p + 1))) out.push_back(*s);
    p = end;
  }
  return out;
}

std::string DisableShoalSnapshotter(const std::string& text, bool* changed) {
  bool any = false;
  std::vector<std::string> out;
  std::vector<std::string> lines = SplitLines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (StartsWith(Trim(l), "# shoal-node-setup: begin")) {
      any = true;
      // The blank line that Enable put before the block goes with it.
      if (!out.empty() && out.back().empty()) out.pop_back();
      while (i < lines.size() && !StartsWith(Trim(lines[i]), kEnd)) ++i;
      continue;
    }
    if (size_t was = l.find(kWas); was != std::string::npos) {
      any = true;
      out.push_back(l.substr(was + sizeof(kWas) - 1));
      continue;
    }
    if (l.size() >= sizeof(kAdded) - 1 &&
        l.compare(l.size() - (sizeof(kAdded) - 1), std::string::npos, kAdded) == 0) {
      any = true;
      continue;
    }
    out.push_back(l);
  }
  if (changed) *changed = any;
  return any ? JoinLines(out) : text;
}

Result<SnapshotterEdit> EnableShoalSnapshotter(const std::string& text, const std::string& socket) {
  const std::string base = DisableShoalSnapshotter(text);
  const std::vector<TomlLine> lines = ScanToml(base);
  using Kind = TomlLine::Kind;

  std::optional<std::string> version;
  for (const TomlLine& l : lines) {
    if (l.kind == Kind::kTable || l.kind == Kind::kArrayTable) break;
    if (l.kind == Kind::kKey && l.path == "version") version = l.value;
  }
  if (!version) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "it has no version = 2 (containerd reads it as a version 1 config, whose "
                     "plugins have other names)");
  }
  if (*version != "2") {
    return MakeError(ErrorCode::kInvalidArgument, "it is version " + *version +
                                                      (*version == "3" ? " (containerd 2)" : "") +
                                                      ", not 2 (containerd 1.6)");
  }

  SnapshotterEdit edit;
  edit.text = text;
  std::vector<std::string> block;                    // appended at the end of the file
  std::map<size_t, std::string> replaced;            // line -> new text
  std::map<size_t, std::vector<std::string>> after;  // header line -> lines inserted after it

  // [proxy_plugins.shoal]: containerd's own or the operator's stays; otherwise ours.
  const std::string proxy = "proxy_plugins.shoal";
  bool proxy_seen = false, proxy_inline = false;
  std::optional<std::string> type, address;
  for (const TomlLine& l : lines) {
    if (l.kind != Kind::kTable && l.kind != Kind::kKey) continue;
    if (Under(l.path, proxy)) proxy_seen = true;
    if (l.kind == Kind::kKey && (l.path == "proxy_plugins" || l.path == proxy)) proxy_inline = true;
    if (l.kind == Kind::kKey && l.path == proxy + ".type") type = TomlString(l.value);
    if (l.kind == Kind::kKey && l.path == proxy + ".address") address = TomlString(l.value);
  }
  const std::string want_proxy = "type = \"snapshot\", address = " + Quote(socket);
  if (proxy_inline) {
    edit.left.push_back("proxy_plugins is an inline table in config.toml: add shoal = { " +
                        want_proxy + " } to it yourself");
  } else if (proxy_seen) {
    if (type == "snapshot" && address == socket) {
      edit.done.push_back("[proxy_plugins.shoal] already has " + want_proxy);
    } else {
      edit.left.push_back(
          "config.toml has its own [proxy_plugins.shoal] with type = " + Quote(type.value_or("")) +
          ", address = " + Quote(address.value_or("")) + ": set " + want_proxy + " there yourself");
    }
  } else {
    block = {"[proxy_plugins.shoal]", "  type = \"snapshot\"", "  address = " + Quote(socket)};
    edit.done.push_back("[proxy_plugins.shoal] " + want_proxy + " added");
  }

  // The CRI's snapshotter settings, in its own table (see the header for why not a drop-in).
  const std::string cri = kCriContainerdTable;
  bool cri_inline = false;
  std::optional<size_t> header, first_key;
  bool dotted = false;  // keys of the table written as dotted keys of a table above it
  std::string current;
  for (size_t i = 0; i < lines.size(); ++i) {
    const TomlLine& l = lines[i];
    if (l.kind == Kind::kTable || l.kind == Kind::kArrayTable) {
      current = l.path;
      if (l.kind == Kind::kTable && l.path == cri) header = i;
      continue;
    }
    if (l.kind != Kind::kKey) continue;
    if (cri == l.path || StartsWith(cri, l.path + ".")) cri_inline = true;
    if (current == cri && !first_key) first_key = i;
    if (Under(l.path, cri) && current != cri && (current.empty() || StartsWith(cri, current + ".")))
      dotted = true;
  }
  struct Want {
    const char* key;
    const char* value;
    bool (*right)(const std::string&);
  };
  const Want wants[] = {
      {"snapshotter", "\"shoal\"", [](const std::string& v) { return TomlString(v) == "shoal"; }},
      // containerd 1.6's default is true: the CRI then passes no layer labels to snapshotters.
      {"disable_snapshot_annotations", "false",
       [](const std::string& v) { return TomlBool(v) == false; }},
  };
  std::vector<std::string> cri_block;
  if (cri_inline) {
    edit.left.push_back(
        "the CRI plugin's settings are an inline table in config.toml: set "
        "snapshotter = \"shoal\" and disable_snapshot_annotations = false in [" +
        cri + "] yourself");
  } else {
    for (const Want& w : wants) {
      const std::string path = cri + "." + w.key;
      const std::string setting = std::string(w.key) + " = " + w.value;
      auto it = std::find_if(lines.begin(), lines.end(), [&](const TomlLine& l) {
        return l.kind == Kind::kKey && l.path == path;
      });
      if (it != lines.end()) {
        size_t i = static_cast<size_t>(it - lines.begin());
        if (w.right(it->value)) {
          edit.done.push_back("[" + cri + "] already has " + setting);
        } else if (it->multiline) {
          edit.left.push_back("[" + cri + "] " + w.key + " spans several lines: set " + setting +
                              " yourself");
        } else {
          size_t eq = FindInKey(it->text, 0, '=');
          replaced[i] = it->text.substr(0, eq + 1) + " " + w.value + kWas + it->text;
          edit.done.push_back("[" + cri + "] " + setting + " (was " + it->value + ")");
        }
      } else if (header) {
        std::string indent = first_key ? LeadingSpace(lines[*first_key].text)
                                       : LeadingSpace(lines[*header].text) + "  ";
        after[*header].push_back(indent + setting + kAdded);
        edit.done.push_back("[" + cri + "] " + setting + " added");
      } else if (dotted) {
        edit.left.push_back("[" + cri + "] is written as dotted keys of a table above it: set " +
                            setting + " there yourself");
      } else {
        cri_block.push_back("  " + setting);
        edit.done.push_back("[" + cri + "] " + setting + " added");
      }
    }
  }
  if (!cri_block.empty()) {
    if (!block.empty()) block.push_back("");
    block.push_back("[" + cri + "]");
    block.insert(block.end(), cri_block.begin(), cri_block.end());
  }
  if (!edit.left.empty()) return edit;

  std::vector<std::string> out;
  for (size_t i = 0; i < lines.size(); ++i) {
    auto r = replaced.find(i);
    out.push_back(r != replaced.end() ? r->second : lines[i].text);
    auto a = after.find(i);
    if (a != after.end()) out.insert(out.end(), a->second.begin(), a->second.end());
  }
  std::string result = JoinLines(out);
  if (!block.empty()) {
    if (!result.empty() && result.back() != '\n') result += '\n';
    result += "\n" + std::string(kBegin) + "\n";
    for (const std::string& b : block) result += b + "\n";
    result += std::string(kEnd) + "\n";
  }
  edit.text = result;
  return edit;
}

}  // namespace shoal::ctl
