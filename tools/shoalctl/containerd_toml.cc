// Reading and editing containerd's config.toml for the agent's snapshotter (see the header).
#include "tools/shoalctl/containerd_toml.h"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "tools/shoalctl/node_files.h"

namespace shoal::ctl {
namespace {

namespace fs = std::filesystem;

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

// A TOML basic string of `s` (the socket has no quotes, backslashes or newlines: node-setup
// refuses others).
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// A key path as TOML writes it, quoting only the parts that need it:
// plugins."io.containerd.grpc.v1.cri".containerd.snapshotter.
std::string KeyPath(const std::vector<std::string>& path) {
  std::string out;
  for (const std::string& part : path) {
    bool bare = !part.empty() && std::all_of(part.begin(), part.end(), [](unsigned char c) {
      return std::isalnum(c) || c == '_' || c == '-';
    });
    out += (out.empty() ? "" : ".") + (bare ? part : Quote(part));
  }
  return out;
}

// The node at `path` under `t`; nullptr if there is none.
const toml::node* At(const toml::table& t, const std::vector<std::string>& path) {
  toml::node_view<const toml::node> v{t};
  for (const std::string& k : path) v = v[k];
  return v.node();
}

toml::table* TableAt(toml::table& t, const std::vector<std::string>& path) {
  toml::node_view<toml::node> v{t};
  for (const std::string& k : path) v = v[k];
  return v.as_table();
}

// The byte offset of 1-based `column` (toml++ counts code points) in `line`.
size_t ByteOfColumn(const std::string& line, size_t column) {
  size_t seen = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    if ((static_cast<unsigned char>(line[i]) & 0xC0) != 0x80 && ++seen == column) return i;
  }
  return line.size();
}

const std::vector<std::string> kProxy = {"proxy_plugins", "shoal"};
const std::vector<std::string> kCri = {"plugins", kCriPlugin, "containerd"};

// `s` as a TOML string value, written as TomlText writes a parsed one.
std::string TomlString(const std::string& s) {
  toml::value<std::string> v(s);
  return TomlText(&v);
}

// "key = value, key = value": a table's settings for messages.
std::string SettingsText(const ShoalTable& table) {
  std::string out;
  for (const ShoalTable::Setting& s : table.settings) {
    out += (out.empty() ? "" : ", ") + s.key + " = " + s.value;
  }
  return out;
}

// Whether two values (not tables) are equal: same type and same value.
bool SameValue(const toml::node& a, const toml::node& b) {
  if (a.type() != b.type()) return false;
  return a.visit([&b](const auto& x) {
    using T = std::remove_cv_t<std::remove_reference_t<decltype(x)>>;
    return x == *b.as<T>();
  });
}

// The first key path where a and b differ, or nullopt when they are equal.
std::optional<std::string> FirstDifference(const toml::table& a, const toml::table& b,
                                           std::vector<std::string>& path) {
  for (auto&& kv : a) {
    path.emplace_back(kv.first.str());
    const toml::node* other = b.get(kv.first.str());
    if (!other) return KeyPath(path);
    if (kv.second.is_table() && other->is_table()) {
      if (auto d = FirstDifference(*kv.second.as_table(), *other->as_table(), path)) return d;
    } else if (!SameValue(kv.second, *other)) {
      return KeyPath(path);
    }
    path.pop_back();
  }
  for (auto&& kv : b) {
    if (!a.contains(kv.first.str())) {
      path.emplace_back(kv.first.str());
      return KeyPath(path);
    }
  }
  return std::nullopt;
}

// `t` without shoal's settings ([proxy_plugins.shoal], the CRI's snapshotter and
// disable_snapshot_annotations), and without the tables that held only those and that `other`
// does not have (the tables shoal's block adds).
toml::table WithoutShoal(toml::table t, const toml::table& other) {
  if (toml::table* p = TableAt(t, {"proxy_plugins"})) p->erase("shoal");
  if (toml::table* c = TableAt(t, kCri)) {
    const std::vector<ShoalTable> tables = ShoalSnapshotterTables("", 2);
    for (const ShoalTable::Setting& s : tables.back().settings) c->erase(s.key);
  }
  for (const std::vector<std::string>& path : {kCri, std::vector<std::string>{"proxy_plugins"}}) {
    for (size_t n = path.size(); n > 0; --n) {
      std::vector<std::string> here(path.begin(), path.begin() + static_cast<long>(n));
      const toml::table* tbl = TableAt(t, here);
      if (!tbl || !tbl->empty() || At(other, here)) break;
      std::vector<std::string> parent(here.begin(), here.end() - 1);
      toml::table* up = parent.empty() ? &t : TableAt(t, parent);
      up->erase(here.back());
    }
  }
  return t;
}

// The edit checked with toml++: `edited` parses, holds shoal's settings when `enabled`, and
// differs from `before` in nothing but shoal's settings.
Status CheckEdit(const toml::table& before, const std::string& edited, const std::string& file,
                 const std::string& socket, bool enabled) {
  const std::string refuse = ": the line-level edit would ";
  auto after = ParseToml(edited, file + " (as edited)");
  if (!after) {
    return MakeError(ErrorCode::kUnsupported,
                     file + refuse + "not be valid TOML (" + after.error().message + ")");
  }
  const toml::table& a = after.value();
  if (enabled) {
    const std::vector<ShoalTable> tables = ShoalSnapshotterTables(socket, 2);
    std::string wrong, wanted;
    for (const ShoalTable& t : tables) {
      for (const ShoalTable::Setting& s : t.settings) {
        std::vector<std::string> path = t.path;
        path.push_back(s.key);
        if (TomlText(At(a, path)) != s.value) wrong += (wrong.empty() ? "" : ", ") + KeyPath(path);
      }
      wanted += (wanted.empty() ? "" : " and ") + ("[" + KeyPath(t.path) + "] ") + SettingsText(t);
    }
    if (!wrong.empty()) {
      return MakeError(ErrorCode::kUnsupported, file + refuse + "not set " + wrong +
                                                    " as intended: set " + wanted + " yourself");
    }
  }
  std::vector<std::string> path;
  if (auto d = FirstDifference(WithoutShoal(before, a), WithoutShoal(a, before), path)) {
    return MakeError(ErrorCode::kUnsupported,
                     file + refuse + "also change " + *d +
                         " (a line it cannot tell from its own marked ones, e.g. one that ends "
                         "in or holds \"" +
                         kTomlMarker + "\")");
  }
  return Ok();
}

// `text` without the lines shoal marked: its block, its added lines, and its changed lines put
// back as they were (the part after "was: ").
std::string TakeBackMarkedLines(const std::string& text, bool* changed) {
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

// Whether `line` is exactly the header [a.b.c] of the table at `path` (a comment may follow):
// the line alone, parsed, is that table and nothing else.
bool IsHeaderOf(const std::string& line, const std::vector<std::string>& path) {
  std::string t = Trim(line);
  if (!StartsWith(t, "[") || StartsWith(t, "[[")) return false;
  auto parsed = ParseToml(line, "");
  if (!parsed) return false;
  const toml::table* tbl = &parsed.value();
  for (const std::string& k : path) {
    if (tbl->size() != 1 || !tbl->contains(k) || !tbl->get(k)->is_table()) return false;
    tbl = tbl->get(k)->as_table();
  }
  return tbl->empty();
}

}  // namespace

Result<toml::table> ParseToml(const std::string& text, const std::string& file) {
  try {
    return toml::parse(std::string_view(text), std::string_view(file));
  } catch (const toml::parse_error& e) {
    const toml::source_position& at = e.source().begin;
    return MakeError(ErrorCode::kInvalidArgument, file + ":" + std::to_string(at.line) + ":" +
                                                      std::to_string(at.column) + ": " +
                                                      std::string(e.description()));
  }
}

std::string TomlText(const toml::node* value) {
  if (!value) return "";
  std::ostringstream os;
  os << toml::toml_formatter(
      *value, toml::toml_formatter::default_flags & ~toml::format_flags::allow_literal_strings);
  return os.str();
}

// containerd 2's names (config version 3) are taken from containerd's own documentation, at
// github.com/containerd/containerd: docs/cri/config.md (read at commit 00142976c794), whose 2.x
// "Snapshotter" section and full configuration put `snapshotter`, `disable_snapshot_annotations`
// and the `registry` table under [plugins.'io.containerd.cri.v1.images']; and
// docs/man/containerd-config.toml.5.md (at 000708dc3101), whose [proxy_plugins] (type, address)
// is a top-level section whatever the config version. containerd 2 is not tested here (Debian 12
// has 1.6).
std::vector<ShoalTable> ShoalSnapshotterTables(const std::string& socket, int version) {
  std::vector<std::string> cri =
      version == 3 ? std::vector<std::string>{"plugins", kCriImagesPluginV3} : kCri;
  return {
      {kProxy, {{"type", TomlString("snapshot")}, {"address", TomlString(socket)}}},
      {cri,
       {{"snapshotter", TomlString("shoal")},
        // containerd 1.6's default is true: the CRI then passes no layer labels to snapshotters.
        {"disable_snapshot_annotations", "false"}}},
  };
}

std::string ShoalSnapshotterSnippet(const std::string& socket, int version) {
  std::string out;
  for (const ShoalTable& t : ShoalSnapshotterTables(socket, version)) {
    out += (out.empty() ? "" : "\n") + ("[" + KeyPath(t.path) + "]\n");
    for (const ShoalTable::Setting& s : t.settings) out += "  " + s.key + " = " + s.value + "\n";
  }
  return out;
}

std::string CriRegistryTable(int version) {
  return version == 3 ? KeyPath({"plugins", kCriImagesPluginV3, "registry"})
                      : KeyPath({"plugins", kCriPlugin, "registry"});
}

std::string ContainerdV3Unsupported(const std::string& socket) {
  return "it is version 3 (containerd 2), and shoal's node-setup and doctor handle containerd "
         "1.6's version 2 config.toml only: containerd 2 is not supported by them yet (not "
         "tested with a containerd 2). Write the settings by hand; `shoalctl config containerd "
         "--snapshotter --config-version 3 --snapshotter-socket " +
         (socket.empty() ? std::string("SOCKET") : socket) +
         "` prints them, with containerd 2's plugin names from its docs/cri/config.md";
}

Status ValidateSnapshotterSocket(const std::string& socket) {
  bool plain = std::none_of(socket.begin(), socket.end(), [](unsigned char c) {
    return c < 0x20 || c == 0x7f || c == '"' || c == '\\';
  });
  if (socket.empty() || socket[0] != '/' || !plain) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--snapshotter-socket \"" + socket +
                         "\" must be an absolute path without quotes, backslashes or control "
                         "characters");
  }
  return Ok();
}

ContainerdConfig LoadContainerdConfig(const std::string& root, const std::string& path) {
  ContainerdConfig config;
  std::vector<std::string> pending = {path};
  std::vector<std::string> loaded;
  for (size_t n = 0; n < pending.size() && n < 64; ++n) {
    const std::string p = pending[n];
    if (std::find(loaded.begin(), loaded.end(), p) != loaded.end()) continue;
    loaded.push_back(p);
    auto text = ReadIfExists(UnderRoot(root, p));
    if (!text) {
      config.errors.push_back(p + ": " + text.error().message);
      continue;
    }
    if (!text.value()) continue;
    auto table = ParseToml(*text.value(), p);
    if (!table) {
      config.errors.push_back(table.error().message);
      continue;
    }
    config.files.push_back({p, std::move(table.value())});
    const toml::array* imports = config.files.back().table["imports"].as_array();
    if (!imports) continue;
    for (const toml::node& i : *imports) {
      if (!i.is_string()) continue;
      std::string imp = i.as_string()->get();
      if (imp.find('*') != std::string::npos) {
        // containerd globs the pattern as written (relative to its working directory).
        std::string under = UnderRoot(root, imp);
        glob_t g{};
        if (::glob(under.c_str(), 0, nullptr, &g) == 0) {
          std::string prefix = root;
          while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
          for (size_t k = 0; k < g.gl_pathc; ++k) {
            pending.push_back(std::string(g.gl_pathv[k]).substr(prefix.size()));
          }
        }
        ::globfree(&g);
      } else {
        if (imp.empty() || imp[0] != '/') imp = (fs::path(p).parent_path() / imp).string();
        pending.push_back(fs::path(imp).lexically_normal().string());
      }
    }
  }
  return config;
}

int64_t ConfigVersion(const ContainerdConfig& config) {
  if (config.files.empty()) return 0;
  const toml::node* v = config.files.front().table.get("version");
  if (!v) return 1;
  return v->is_integer() ? v->as_integer()->get() : 0;
}

ContainerdSetting SectionSetting(const ContainerdConfig& config, std::string_view top,
                                 std::string_view name,
                                 std::initializer_list<std::string_view> key) {
  ContainerdSetting s;
  for (const ContainerdConfig::File& f : config.files) {
    toml::node_view<const toml::node> section = f.table[top][name];
    if (!section) continue;
    for (std::string_view k : key) section = section[k];
    s = {section.node(), f.path, true};
  }
  return s;
}

ContainerdSetting PlainSetting(const ContainerdConfig& config,
                               std::initializer_list<std::string_view> key) {
  ContainerdSetting s;
  for (const ContainerdConfig::File& f : config.files) {
    toml::node_view<const toml::node> v{f.table};
    for (std::string_view k : key) v = v[k];
    if (v) s = {v.node(), f.path, true};
  }
  return s;
}

Result<std::string> DisableShoalSnapshotter(const std::string& text, const std::string& file,
                                            bool* changed) {
  bool any = false;
  std::string restored = TakeBackMarkedLines(text, &any);
  if (changed) *changed = any;
  if (!any) return text;
  auto before = ParseToml(text, file);
  if (!before) return before.error();
  if (auto ok = CheckEdit(before.value(), restored, file, "", false); !ok) return ok.error();
  return restored;
}

Result<SnapshotterEdit> EnableShoalSnapshotter(const std::string& text, const std::string& socket,
                                               const std::string& file) {
  auto original = ParseToml(text, file);
  if (!original) return original.error();
  const std::string base = TakeBackMarkedLines(text, nullptr);
  auto parsed = ParseToml(base, file + " (without shoal's marked lines)");
  if (!parsed) return parsed.error();
  const toml::table& doc = parsed.value();
  const std::vector<std::string> lines = SplitLines(base);

  const toml::node* version = doc.get("version");
  if (!version) {
    return MakeError(ErrorCode::kInvalidArgument,
                     file +
                         ": it has no version = 2 (containerd reads it as a version 1 config, "
                         "whose plugins have other names)");
  }
  if (version->is_integer() && version->as_integer()->get() == 3) {
    return MakeError(ErrorCode::kUnsupported, file + ": " + ContainerdV3Unsupported(socket));
  }
  if (!version->is_integer() || version->as_integer()->get() != 2) {
    return MakeError(ErrorCode::kInvalidArgument,
                     file + ": it is version " + TomlText(version) + ", not 2 (containerd 1.6)");
  }

  const std::vector<ShoalTable> tables = ShoalSnapshotterTables(socket, 2);
  const ShoalTable& proxy = tables.front();
  const ShoalTable& cri_settings = tables.back();
  SnapshotterEdit edit;
  edit.text = text;
  std::vector<std::string> block;                    // appended at the end of the file
  std::map<size_t, std::string> replaced;            // line -> new text
  std::map<size_t, std::vector<std::string>> after;  // header line -> lines inserted after it

  // [proxy_plugins.shoal]: containerd's own or the operator's stays; otherwise ours.
  const std::string want_proxy = SettingsText(proxy);
  const toml::node* proxies = doc.get("proxy_plugins");
  if (At(doc, kProxy)) {
    std::string theirs;
    bool same = true;
    for (const ShoalTable::Setting& w : proxy.settings) {
      std::vector<std::string> path = kProxy;
      path.push_back(w.key);
      const std::string value = TomlText(At(doc, path));
      same = same && value == w.value;
      theirs += (theirs.empty() ? "" : ", ") + w.key + " = " + (value.empty() ? "\"\"" : value);
    }
    if (same) {
      edit.done.push_back("[proxy_plugins.shoal] already has " + want_proxy);
    } else {
      edit.left.push_back("config.toml has its own [proxy_plugins.shoal] with " + theirs +
                          ": set " + want_proxy + " there yourself");
    }
  } else if (proxies && (!proxies->is_table() || proxies->as_table()->is_inline())) {
    // A [proxy_plugins.shoal] header cannot add to an inline table.
    edit.left.push_back("proxy_plugins is an inline table in config.toml: add shoal = { " +
                        want_proxy + " } to it yourself");
  } else {
    block = {"[" + KeyPath(proxy.path) + "]"};
    for (const ShoalTable::Setting& w : proxy.settings)
      block.push_back("  " + w.key + " = " + w.value);
    edit.done.push_back("[proxy_plugins.shoal] " + want_proxy + " added");
  }

  // The CRI's snapshotter settings, in its own table (see the header for why not a drop-in).
  const std::string cri = kCriContainerdTable;
  bool cri_inline = false;
  for (size_t n = 1; n <= kCri.size(); ++n) {
    const toml::node* t = At(doc, std::vector<std::string>(kCri.begin(), kCri.begin() + n));
    if (t && (!t->is_table() || t->as_table()->is_inline())) cri_inline = true;
  }
  const toml::node* cri_node = cri_inline ? nullptr : At(doc, kCri);
  const toml::table* table = cri_node ? cri_node->as_table() : nullptr;
  // Where the table is written: under its own [header], only as the parent of other tables'
  // headers (then the block defines it), or as dotted keys of a table above it.
  std::optional<size_t> header;
  bool dotted = false;
  if (table) {
    size_t line = table->source().begin.line;
    if (line >= 1 && line <= lines.size() && IsHeaderOf(lines[line - 1], kCri)) {
      header = line - 1;
    } else if (line < 1 || line > lines.size() || !StartsWith(Trim(lines[line - 1]), "[")) {
      dotted = true;
    }
  }
  std::vector<std::string> cri_block;
  if (cri_inline) {
    edit.left.push_back("the CRI plugin's settings are an inline table in config.toml: set " +
                        SettingsText(cri_settings) + " in [" + cri + "] yourself");
  } else {
    for (const ShoalTable::Setting& w : cri_settings.settings) {
      const std::string setting = w.key + " = " + w.value;
      const toml::node* v = table ? table->get(w.key) : nullptr;
      if (v) {
        const toml::source_region& src = v->source();
        if (TomlText(v) == w.value) {
          edit.done.push_back("[" + cri + "] already has " + setting);
        } else if (src.begin.line != src.end.line || src.begin.line < 1 ||
                   src.begin.line > lines.size()) {
          edit.left.push_back("[" + cri + "] " + w.key + " spans several lines: set " + setting +
                              " yourself");
        } else {
          // The value starts on its key's line: keep what is before it (the key, dotted or not).
          size_t i = src.begin.line - 1;
          size_t at = ByteOfColumn(lines[i], src.begin.column);
          replaced[i] = lines[i].substr(0, at) + w.value + kWas + lines[i];
          edit.done.push_back("[" + cri + "] " + setting + " (was " + TomlText(v) + ")");
        }
      } else if (header) {
        // Indented as the table's first value, or two more than its header.
        std::optional<size_t> first;
        for (auto&& kv : *table) {
          size_t l = kv.second.source().begin.line;
          if (!kv.second.is_table() && l > *header + 1 && l <= lines.size() &&
              (!first || l - 1 < *first)) {
            first = l - 1;
          }
        }
        std::string indent =
            first ? LeadingSpace(lines[*first]) : LeadingSpace(lines[*header]) + "  ";
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
    out.push_back(r != replaced.end() ? r->second : lines[i]);
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
  // Checked against the file as it is, not as taken back: taking back must not change anything
  // but shoal's settings either.
  if (auto ok = CheckEdit(original.value(), result, file, socket, true); !ok) return ok.error();
  edit.text = result;
  return edit;
}

}  // namespace shoal::ctl
