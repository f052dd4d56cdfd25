// The snapshot store with containerd's semantics (snapshots/storage and the overlay
// snapshotter): chains of committed parents, views, labels, errors, persistence, cleanup.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "snapshotter/filter.h"
#include "snapshotter/store.h"

#include "tests/support/why.h"

namespace shoal::snapshotter {
namespace fs = std::filesystem;

namespace {

struct TempRoot {
  std::string path;
  TempRoot() {
    char tmpl[] = "/tmp/shoal-snapshots-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempRoot() { fs::remove_all(path); }
};

std::unique_ptr<Store> OpenStore(const std::string& root) {
  auto store = Store::Open(root);
  REQUIRE_MESSAGE(store.has_value(), Why(store));
  return std::move(store.value());
}

// The option of `m` that starts with `prefix` ("upperdir="), without the prefix; "" if none.
std::string Option(const Mount& m, const std::string& prefix) {
  for (const auto& o : m.options)
    if (o.rfind(prefix, 0) == 0) return o.substr(prefix.size());
  return "";
}

// The directory an active snapshot's files go to: its bind source or its overlay upperdir.
std::string UpperDir(const std::vector<Mount>& mounts) {
  REQUIRE(mounts.size() == 1);
  if (mounts[0].type == "bind") return mounts[0].source;
  return Option(mounts[0], "upperdir=");
}

void Write(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

// Prepares `key` on `parent`, writes one file into it and commits it as `name`; returns the
// snapshot's fs directory.
std::string Layer(Store& s, const std::string& name, const std::string& parent,
                  const std::string& file) {
  auto mounts = s.Prepare("extract-" + name, parent, {});
  REQUIRE_MESSAGE(mounts.has_value(), Why(mounts));
  std::string dir = UpperDir(mounts.value());
  Write(dir + "/" + file, std::string(10000, 'x'));
  auto st = s.Commit(name, "extract-" + name, {{"containerd.io/snapshot.ref", name}});
  REQUIRE_MESSAGE(st.has_value(), Why(st));
  return dir;
}

}  // namespace

TEST_CASE("snapshotter: a base snapshot is a bind mount, rw when active and ro as a view") {
  TempRoot root;
  auto s = OpenStore(root.path);
  auto active = s->Prepare("a", "", {});
  REQUIRE(active.has_value());
  REQUIRE(active.value().size() == 1);
  const Mount& m = active.value()[0];
  CHECK(m.type == "bind");
  CHECK(m.options == std::vector<std::string>{"rw", "rbind"});
  CHECK(fs::is_directory(m.source));
  CHECK(fs::path(m.source).filename() == "fs");
  // Its work dir sits beside it (overlay needs one once a child is prepared on it).
  CHECK(fs::is_directory(fs::path(m.source).parent_path() / "work"));

  auto view = s->View("v", "", {});
  REQUIRE(view.has_value());
  CHECK(view.value()[0].type == "bind");
  CHECK(view.value()[0].options == std::vector<std::string>{"ro", "rbind"});
  CHECK_FALSE(fs::exists(fs::path(view.value()[0].source).parent_path() / "work"));
}

TEST_CASE("snapshotter: a chain of committed layers mounts as overlay, nearest parent first") {
  TempRoot root;
  auto s = OpenStore(root.path);
  std::string l1 = Layer(*s, "l1", "", "one");
  std::string l2 = Layer(*s, "l2", "l1", "two");
  std::string l3 = Layer(*s, "l3", "l2", "three");

  auto active = s->Prepare("container", "l3", {});
  REQUIRE(active.has_value());
  REQUIRE(active.value().size() == 1);
  const Mount& m = active.value()[0];
  CHECK(m.type == "overlay");
  CHECK(m.source == "overlay");
  CHECK(Option(m, "lowerdir=") == l3 + ":" + l2 + ":" + l1);
  std::string upper = Option(m, "upperdir=");
  std::string work = Option(m, "workdir=");
  CHECK(fs::is_directory(upper));
  CHECK(fs::is_directory(work));
  CHECK(fs::path(upper).parent_path() == fs::path(work).parent_path());
  // containerd's order: index=off (when the kernel has it), workdir, upperdir, lowerdir.
  CHECK(m.options.back().rfind("lowerdir=", 0) == 0);
  if (fs::exists("/sys/module/overlay/parameters/index")) CHECK(m.options.front() == "index=off");

  // A view of one layer is a read-only bind of it; of several, an overlay without upper dir.
  auto v1 = s->View("v1", "l1", {});
  REQUIRE(v1.has_value());
  CHECK(v1.value()[0] == Mount{"bind", l1, {"ro", "rbind"}});
  auto v3 = s->View("v3", "l3", {});
  REQUIRE(v3.has_value());
  CHECK(v3.value()[0].type == "overlay");
  CHECK(Option(v3.value()[0], "lowerdir=") == l3 + ":" + l2 + ":" + l1);
  CHECK(Option(v3.value()[0], "upperdir=").empty());

  // Mounts gives the same answer again; a committed snapshot has none.
  auto again = s->Mounts("container");
  REQUIRE(again.has_value());
  CHECK(again.value() == active.value());
  auto committed = s->Mounts("l2");
  REQUIRE_FALSE(committed.has_value());
  CHECK(committed.error().code == Errc::kFailedPrecondition);
}

TEST_CASE("snapshotter: commit turns the active key into the name, with new labels and times") {
  TempRoot root;
  auto s = OpenStore(root.path);
  auto prepared = s->Prepare("key", "", {{"a", "1"}, {"containerd.io/gc.root", "x"}});
  REQUIRE(prepared.has_value());
  auto before = s->Stat("key");
  REQUIRE(before.has_value());
  CHECK(before.value().kind == Kind::kActive);
  CHECK(before.value().labels.at("a") == "1");
  std::string dir = UpperDir(prepared.value());
  Write(dir + "/file", std::string(100000, 'y'));
  // An active snapshot's usage is measured now; a hard link counts once.
  REQUIRE(::link((dir + "/file").c_str(), (dir + "/link").c_str()) == 0);
  auto usage = s->GetUsage("key");
  REQUIRE(usage.has_value());
  CHECK(usage.value().inodes == 2);  // the fs dir and the file
  CHECK(usage.value().size >= 100000);

  REQUIRE(s->Commit("name", "key", {{"b", "2"}}).has_value());
  auto gone = s->Stat("key");
  REQUIRE_FALSE(gone.has_value());
  CHECK(gone.error().code == Errc::kNotFound);
  auto info = s->Stat("name");
  REQUIRE(info.has_value());
  CHECK(info.value().name == "name");
  CHECK(info.value().kind == Kind::kCommitted);
  CHECK(info.value().labels == Labels{{"b", "2"}});  // replaced, as containerd does
  CHECK(info.value().created >= before.value().created);
  CHECK(info.value().updated == info.value().created);
  // A committed snapshot's usage is what the commit measured.
  auto committed_usage = s->GetUsage("name");
  REQUIRE(committed_usage.has_value());
  CHECK(committed_usage.value().size == usage.value().size);
  CHECK(committed_usage.value().inodes == usage.value().inodes);
  // The files stay where they were: the committed layer is the old upper dir.
  auto child = s->View("child", "name", {});
  REQUIRE(child.has_value());
  CHECK(child.value()[0].source == dir);
  CHECK(fs::exists(dir + "/file"));
}

TEST_CASE("snapshotter: errors carry containerd's codes") {
  TempRoot root;
  auto s = OpenStore(root.path);
  Layer(*s, "base", "", "f");
  REQUIRE(s->Prepare("active", "base", {}).has_value());
  REQUIRE(s->View("view", "base", {}).has_value());

  auto code = [](const auto& r) { return r.error().code; };
  // Keys are unique across kinds, for Prepare, View and Commit alike.
  CHECK(code(s->Prepare("active", "", {})) == Errc::kAlreadyExists);
  CHECK(code(s->View("base", "", {})) == Errc::kAlreadyExists);
  REQUIRE(s->Prepare("a2", "", {}).has_value());
  CHECK(code(s->Commit("base", "a2", {})) == Errc::kAlreadyExists);
  // Missing things.
  CHECK(code(s->Prepare("x", "missing", {})) == Errc::kNotFound);
  CHECK(code(s->Commit("n", "missing", {})) == Errc::kNotFound);
  CHECK(code(s->Stat("missing")) == Errc::kNotFound);
  CHECK(code(s->Mounts("missing")) == Errc::kNotFound);
  CHECK(code(s->Remove("missing")) == Errc::kNotFound);
  CHECK(code(s->GetUsage("missing")) == Errc::kNotFound);
  // Wrong kinds: only a committed snapshot is a parent, only an active one commits.
  CHECK(code(s->Prepare("x", "active", {})) == Errc::kInvalidArgument);
  CHECK(code(s->View("x", "view", {})) == Errc::kInvalidArgument);
  CHECK(code(s->Commit("n", "view", {})) == Errc::kFailedPrecondition);
  CHECK(code(s->Commit("n", "base", {})) == Errc::kFailedPrecondition);
  // Bad input.
  CHECK(code(s->Prepare("", "", {})) == Errc::kInvalidArgument);
  CHECK(code(s->Commit("", "a2", {})) == Errc::kInvalidArgument);
  CHECK(code(s->Prepare("big", "", {{"k", std::string(4096, 'v')}})) == Errc::kInvalidArgument);
  Info other;
  other.name = "base";
  CHECK(code(s->Update(other, {"parent"})) == Errc::kInvalidArgument);
  // Messages say what failed on what.
  auto missing = s->Prepare("x", "missing", {});
  CHECK(missing.error().message.find("\"missing\"") != std::string::npos);
  // No failed call left a directory behind: one per snapshot (base, active, view, a2).
  size_t dirs = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(root.path + "/snapshots")) ++dirs;
  CHECK(dirs == 4);
}

TEST_CASE("snapshotter: remove refuses a snapshot with children and frees the space") {
  TempRoot root;
  auto s = OpenStore(root.path);
  std::string l1 = Layer(*s, "l1", "", "one");
  std::string l2 = Layer(*s, "l2", "l1", "two");
  REQUIRE(s->View("v", "l2", {}).has_value());

  auto refused = s->Remove("l2");
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == Errc::kFailedPrecondition);
  CHECK(refused.error().message.find("\"v\"") != std::string::npos);
  CHECK(s->Remove("l1").error().code == Errc::kFailedPrecondition);
  CHECK(fs::exists(l2));

  // Committed layers count on disk (the agent's cache budget reads this); views do not.
  const uint64_t both = s->CommittedBytes();
  CHECK(both > 0);
  int changes = 0;
  s->SetOnChange([&changes] { ++changes; });
  // Leaves first, then their parents.
  REQUIRE(s->Remove("v").has_value());
  CHECK(changes == 1);
  CHECK(s->CommittedBytes() == both);
  REQUIRE(s->Remove("l2").has_value());
  CHECK_FALSE(fs::exists(fs::path(l2).parent_path()));
  CHECK(s->CommittedBytes() < both);
  REQUIRE(s->Remove("l1").has_value());
  CHECK_FALSE(fs::exists(fs::path(l1).parent_path()));
  CHECK(s->List().empty());
  CHECK(s->CommittedBytes() == 0);
  // The key is free again, with a new directory (ids are never reused).
  auto again = s->Prepare("l1", "", {});
  REQUIRE(again.has_value());
  CHECK(UpperDir(again.value()) != l1);
}

TEST_CASE("snapshotter: update changes labels only, by field path") {
  TempRoot root;
  auto s = OpenStore(root.path);
  REQUIRE(s->Prepare("k", "", {{"a", "1"}, {"b", "2"}}).has_value());
  auto created = s->Stat("k").value();

  Info in;
  in.name = "k";
  in.labels = {{"a", "10"}, {"c", "3"}};
  // One label by path: only that one changes.
  auto one = s->Update(in, {"labels.a"});
  REQUIRE(one.has_value());
  CHECK(one.value().labels == Labels{{"a", "10"}, {"b", "2"}});
  CHECK(one.value().updated >= created.updated);
  CHECK(one.value().created == created.created);
  // A label path with no value deletes it.
  auto del = s->Update(in, {"labels.b"});
  REQUIRE(del.has_value());
  CHECK(del.value().labels == Labels{{"a", "10"}});
  // "labels", or no path at all: the whole set is replaced.
  auto all = s->Update(in, {});
  REQUIRE(all.has_value());
  CHECK(all.value().labels == in.labels);
  in.labels = {{"z", "26"}};
  REQUIRE(s->Update(in, {"labels"}).has_value());
  CHECK(s->Stat("k").value().labels == Labels{{"z", "26"}});
  CHECK(s->Stat("k").value().kind == Kind::kActive);
}

TEST_CASE("snapshotter: every snapshot survives reopening the store") {
  TempRoot root;
  std::string l1, l2;
  std::vector<Mount> active_mounts;
  uint64_t committed = 0;
  {
    auto s = OpenStore(root.path);
    l1 = Layer(*s, "l1", "", "one");
    l2 = Layer(*s, "l2", "l1", "two");
    committed = s->CommittedBytes();
    auto active = s->Prepare("active", "l2", {{"k", "v"}});
    REQUIRE(active.has_value());
    active_mounts = active.value();
    REQUIRE(s->View("view", "l1", {}).has_value());
  }
  auto s = OpenStore(root.path);
  CHECK(s->CommittedBytes() == committed);
  auto list = s->List();
  REQUIRE(list.size() == 4);
  CHECK(list[0].name == "active");
  CHECK(list[1].name == "l1");
  CHECK(list[2].name == "l2");
  CHECK(list[3].name == "view");
  CHECK(list[0].labels == Labels{{"k", "v"}});
  CHECK(list[2].parent == "l1");
  CHECK(list[2].kind == Kind::kCommitted);
  CHECK(list[3].kind == Kind::kView);
  CHECK(list[2].labels == Labels{{"containerd.io/snapshot.ref", "l2"}});
  auto mounts = s->Mounts("active");
  REQUIRE(mounts.has_value());
  CHECK(mounts.value() == active_mounts);
  CHECK(s->GetUsage("l2").value().size >= 10000);
  // A new snapshot after the reopen gets a directory of its own.
  auto fresh = s->Prepare("fresh", "l2", {});
  REQUIRE(fresh.has_value());
  CHECK(UpperDir(fresh.value()) != UpperDir(active_mounts));
  CHECK(fs::path(UpperDir(fresh.value())).parent_path() != fs::path(l1).parent_path());
  CHECK(fs::path(UpperDir(fresh.value())).parent_path() != fs::path(l2).parent_path());
}

TEST_CASE("snapshotter: a corrupt metadata file fails the open, naming it") {
  TempRoot root;
  { auto s = OpenStore(root.path); }
  Write(root.path + "/metadata.json", "{\"version\": 1, \"next_id\": \"x\"");
  auto s = Store::Open(root.path);
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().message.find(root.path + "/metadata.json") != std::string::npos);
}

TEST_CASE("snapshotter: cleanup removes directories that no snapshot refers to") {
  TempRoot root;
  std::string kept;
  {
    auto s = OpenStore(root.path);
    kept = Layer(*s, "kept", "", "f");
  }
  // What a crash leaves: a Create's temporary directory, and a renamed directory whose record
  // was never saved.
  fs::create_directories(root.path + "/snapshots/new-abc123/fs");
  fs::create_directories(root.path + "/snapshots/77/fs");
  Write(root.path + "/snapshots/77/fs/data", "orphan");
  auto s = OpenStore(root.path);
  // The orphan's id is not handed out again.
  auto next = s->Prepare("next", "", {});
  REQUIRE(next.has_value());
  CHECK(fs::path(UpperDir(next.value())).parent_path().filename() == "78");

  auto removed = s->Cleanup();
  REQUIRE_MESSAGE(removed.has_value(), Why(removed));
  CHECK(removed.value() == 2);
  CHECK_FALSE(fs::exists(root.path + "/snapshots/new-abc123"));
  CHECK_FALSE(fs::exists(root.path + "/snapshots/77"));
  CHECK(fs::exists(kept + "/f"));
  CHECK(fs::exists(UpperDir(next.value())));
  CHECK(s->Cleanup().value() == 0);
}

TEST_CASE("snapshotter: a child's upper dir takes the owner of its parent's root") {
  TempRoot root;
  auto s = OpenStore(root.path);
  std::string base = Layer(*s, "base", "", "f");
  REQUIRE(::chown(base.c_str(), 1234, 5678) == 0);
  auto child = s->Prepare("child", "base", {});
  REQUIRE(child.has_value());
  struct stat st;
  REQUIRE(::stat(UpperDir(child.value()).c_str(), &st) == 0);
  CHECK(st.st_uid == 1234u);
  CHECK(st.st_gid == 5678u);
}

TEST_CASE("snapshotter: list filters use containerd's syntax") {
  Info committed;
  committed.name = "default/3/sha256:abc";
  committed.parent = "default/2/sha256:def";
  committed.kind = Kind::kCommitted;
  committed.labels = {{"containerd.io/snapshot.ref", "sha256:abc"}};
  Info active;
  active.name = "extract-1";
  active.kind = Kind::kActive;

  auto match = [](const std::string& text, const Info& info) {
    auto f = Filter::Parse(text);
    REQUIRE_MESSAGE(f.has_value(), Why(f));
    return f.value().Matches(info);
  };
  CHECK(match("kind==committed", committed));
  CHECK_FALSE(match("kind==committed", active));
  CHECK(match("kind!=committed", active));
  CHECK(match("name==\"default/3/sha256:abc\"", committed));
  CHECK(match("parent", committed));
  CHECK(match("labels.\"containerd.io/snapshot.ref\"", committed));
  CHECK_FALSE(match("labels.\"containerd.io/snapshot.ref\"", active));
  CHECK(match("labels.\"containerd.io/snapshot.ref\"==sha256:abc,kind==committed", committed));
  CHECK_FALSE(match("labels.\"containerd.io/snapshot.ref\"==sha256:abc,kind==active", committed));
  CHECK(match("name~=^extract-", active));
  // Filters in a list are alternatives.
  std::vector<Filter> any = {Filter::Parse("kind==view").value(),
                             Filter::Parse("kind==active").value()};
  CHECK(MatchesAny(any, active));
  CHECK_FALSE(MatchesAny(any, committed));
  for (const char* bad : {"", "kind==", "==x", "kind==a b", "name~=(", "kind=committed"}) {
    CAPTURE(bad);
    auto f = Filter::Parse(bad);
    REQUIRE_FALSE(f.has_value());
    CHECK(f.error().code == Errc::kInvalidArgument);
  }
}

}  // namespace shoal::snapshotter
