#pragma once
// containerd's config.toml (version 2, containerd 1.6) for the agent's snapshotter: reading
// the few settings node-setup and doctor need, and editing them in place. Not a TOML parser:
// a line scanner that knows tables, keys (dotted and quoted), comments and multi-line values,
// which is enough for what `containerd config default` and node images write.
//
// Why in place and not a drop-in under `imports`: containerd 1.6 merges an imported file's
// plugin sections by replacing the whole section (containerd issue #5837; merged per key only
// from 2.0), so a drop-in holding [plugins."io.containerd.grpc.v1.cri".containerd] would drop
// every other CRI setting of config.toml (config_path, sandbox_image, runtimes).

#include <optional>
#include <string>
#include <vector>

#include "lib/core/error.h"

namespace shoal::ctl {

// Every line node-setup adds or changes in config.toml carries this comment, so that cleanup
// takes back exactly those lines and nothing else.
inline constexpr char kTomlMarker[] = "# shoal-node-setup:";

// The CRI plugin's table that holds its snapshotter settings in containerd 1.6.
inline constexpr char kCriContainerdTable[] = "plugins.\"io.containerd.grpc.v1.cri\".containerd";

// One line of a TOML file, classified.
struct TomlLine {
  enum class Kind { kOther, kTable, kArrayTable, kKey, kContinuation };
  Kind kind = Kind::kOther;
  std::string text;
  // kTable / kArrayTable: the table's name; kKey: the key's full path (table + key). Quoted
  // parts that need no quotes lose them; others keep double quotes:
  // plugins."io.containerd.grpc.v1.cri".containerd.snapshotter.
  std::string path;
  // kKey: the value as written on this line, without its comment, trimmed.
  std::string value;
  // kKey: the value goes on over the next lines (an array or a multi-line string).
  bool multiline = false;
};

// The lines of `text` (split at '\n'; joining them with '\n' gives `text` back).
std::vector<TomlLine> ScanToml(const std::string& text);

// A TOML value as a string: "..." (the common escapes) or '...'; nullopt for anything else.
std::optional<std::string> TomlString(const std::string& value);
// A TOML value as a boolean; nullopt unless it is true or false.
std::optional<bool> TomlBool(const std::string& value);
// The strings of a one-line or multi-line array starting at lines[i] (e.g. imports).
std::vector<std::string> TomlStrings(const std::vector<TomlLine>& lines, size_t i);

// What EnableShoalSnapshotter would change, or why it changes nothing.
struct SnapshotterEdit {
  std::string text;               // the new config.toml
  std::vector<std::string> done;  // one line per setting set or found already right
  std::vector<std::string> left;  // settings it cannot make, each saying what to do instead
};

// config.toml with the shoal proxy snapshotter at `socket` and the CRI using it:
// [proxy_plugins.shoal] type = "snapshot", address = socket (appended in a marked block) and,
// in [plugins."io.containerd.grpc.v1.cri".containerd], snapshotter = "shoal" and
// disable_snapshot_annotations = false (changed lines keep the original in their comment).
// Earlier edits of its own are taken back first, so it is idempotent. When `left` is not
// empty, `text` is the input unchanged (all or nothing). Errors: kInvalidArgument when the file
// is not a version 2 config (version 1 names plugins differently; version 3 is containerd 2).
Result<SnapshotterEdit> EnableShoalSnapshotter(const std::string& text, const std::string& socket);

// config.toml without anything EnableShoalSnapshotter added or changed: marked lines only, so
// the operator's later edits stay. `changed` says whether there was anything to take back.
std::string DisableShoalSnapshotter(const std::string& text, bool* changed = nullptr);

}  // namespace shoal::ctl
