#pragma once
// containerd's config.toml (version 2, containerd 1.6) for the agent's snapshotter: reading the
// few settings node-setup and doctor need, and editing them in place. Reading is toml++'s
// (toml::parse). Editing is ours, line by line, because toml++ cannot write a file back with its
// comments and layout: every line node-setup adds or changes is marked, and every edit is parsed
// again and must hold shoal's settings and change nothing else, or it is refused.
//
// Why in place and not a drop-in under `imports`: containerd 1.6 merges an imported file's
// plugin sections by replacing the whole section (containerd issue #5837; merged per key only
// from 2.0), so a drop-in holding [plugins."io.containerd.grpc.v1.cri".containerd] would drop
// every other CRI setting of config.toml (config_path, sandbox_image, runtimes).

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "lib/core/error.h"

namespace shoal::ctl {

// Every line node-setup adds or changes in config.toml carries this comment, so that cleanup
// takes back exactly those lines and nothing else.
inline constexpr char kTomlMarker[] = "# shoal-node-setup:";

// The CRI plugin's id: its section is plugins."io.containerd.grpc.v1.cri".
inline constexpr char kCriPlugin[] = "io.containerd.grpc.v1.cri";
// The CRI plugin's table that holds its snapshotter settings in containerd 1.6.
inline constexpr char kCriContainerdTable[] = "plugins.\"io.containerd.grpc.v1.cri\".containerd";

// The CRI plugin's image service in containerd 2's config version 3, which holds its
// snapshotter settings there (containerd's docs/cri/config.md, "Snapshotter" and the 2.x full
// configuration). Not tested against a containerd 2 here: Debian 12 ships 1.6.
inline constexpr char kCriImagesPluginV3[] = "io.containerd.cri.v1.images";

// One table of config.toml with the settings the agent's snapshotter needs there.
struct ShoalTable {
  struct Setting {
    std::string key;
    std::string value;  // as TOML writes it: "\"snapshot\"", false
  };
  std::vector<std::string> path;  // e.g. {"proxy_plugins", "shoal"}
  std::vector<Setting> settings;
};

// The four settings of the agent's snapshotter at `socket`: [proxy_plugins.shoal] type =
// "snapshot" and address, then the CRI's snapshotter = "shoal" and disable_snapshot_annotations =
// false, in [plugins."io.containerd.grpc.v1.cri".containerd] for config `version` 2
// (containerd 1.6) or [plugins."io.containerd.cri.v1.images"] for 3 (containerd 2; from its
// docs only). What `shoalctl config containerd --snapshotter` prints and node-setup writes.
// Requires version 2 or 3.
std::vector<ShoalTable> ShoalSnapshotterTables(const std::string& socket, int version);
// Those tables as TOML text (a header and its settings per table), to merge into config.toml.
std::string ShoalSnapshotterSnippet(const std::string& socket, int version);
// The table that holds the CRI's registry config_path in config `version` 2 or 3, as TOML
// writes its header's key: plugins."io.containerd.grpc.v1.cri".registry.
std::string CriRegistryTable(int version);
// Why node-setup and doctor do not handle a version 3 config.toml (containerd 2), and what to
// write by hand instead: the command that prints the settings for the agent at `socket`.
std::string ContainerdV3Unsupported(const std::string& socket);
// The socket as node-setup and `config containerd` accept it. Errors: kInvalidArgument unless
// it is an absolute path without quotes, backslashes or newlines.
Status ValidateSnapshotterSocket(const std::string& socket);

// `text` parsed as TOML. Errors: kInvalidArgument "<file>:<line>:<column>: <toml++'s reason>".
Result<toml::table> ParseToml(const std::string& text, const std::string& file);

// A value as TOML writes it (strings in double quotes); "" for nullptr.
std::string TomlText(const toml::node* value);

// config.toml and the files it imports, parsed, in the order containerd 1.6 loads them (breadth
// first, each once; a pattern with * is globbed; missing imports are skipped).
struct ContainerdConfig {
  struct File {
    std::string path;  // on the node
    toml::table table;
  };
  std::vector<File> files;          // empty when config.toml does not exist
  std::vector<std::string> errors;  // files that cannot be read or parsed (file:line:column)
};
ContainerdConfig LoadContainerdConfig(const std::string& root, const std::string& path);

// The `version` of the first file (config.toml itself): 1 when it has none (containerd's
// default), 0 when it is not an integer or there is no file.
int64_t ConfigVersion(const ContainerdConfig& config);

// A setting as containerd 1.6 merges config.toml with its imports.
struct ContainerdSetting {
  const toml::node* value = nullptr;  // nullptr: not set (points into the ContainerdConfig)
  std::string file;                   // where it is (for a section: the file that holds it)
  bool section_found = false;
};
// The value at `key` inside the section <top>.<name> (plugins."io.containerd.grpc.v1.cri",
// proxy_plugins.shoal): an imported file that has the section replaces it whole, so the last
// file with the section decides.
ContainerdSetting SectionSetting(const ContainerdConfig& config, std::string_view top,
                                 std::string_view name,
                                 std::initializer_list<std::string_view> key);
// A plain setting (e.g. grpc.address): the last file that sets it.
ContainerdSetting PlainSetting(const ContainerdConfig& config,
                               std::initializer_list<std::string_view> key);

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
// empty, `text` is the input unchanged (all or nothing): settings in inline tables, spanning
// several lines, or missing from a table written as dotted keys. `file` names config.toml in
// messages. Errors (each message starting with `file`): kInvalidArgument when `text` is not
// TOML (file:line:column) or not a version 2 config (version 1 names plugins differently);
// kUnsupported for version 3 (containerd 2: not supported yet; the message says what to write
// by hand) and when the edited text, parsed, would not hold those settings or would differ in
// anything else.
Result<SnapshotterEdit> EnableShoalSnapshotter(const std::string& text, const std::string& socket,
                                               const std::string& file);

// config.toml without anything EnableShoalSnapshotter added or changed: marked lines only, so
// the operator's later edits stay. `changed` says whether there was anything to take back (none:
// `text` is returned as is, unparsed). Errors (each message starting with `file`):
// kInvalidArgument when `text` has marked lines and is not TOML (file:line:column);
// kUnsupported when the result, parsed, would differ from `text` in more than shoal's settings.
Result<std::string> DisableShoalSnapshotter(const std::string& text, const std::string& file,
                                            bool* changed = nullptr);

}  // namespace shoal::ctl
