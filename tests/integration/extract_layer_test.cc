// The extraction engine (lib/extract) on real files: hostile tarballs, formats, metadata,
// whiteouts against umoci's reference unpack, parallel against sequential, growing sources.
#include <doctest/doctest.h>

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/sysmacros.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "lib/core/sha256.h"
#include "lib/extract/image.h"
#include "lib/extract/layer.h"
#include "tests/support/image.h"
#include "tests/support/layer_tar.h"
#include "tests/support/process.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

namespace fs = std::filesystem;
using extract::ExtractOptions;
using extract::LayerStats;
using TarType = TarEntry::Type;

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

Result<LayerStats> ExtractBytes(const std::string& blob, const std::string& dir,
                                const ExtractOptions& opts = {}) {
  auto src = extract::MemorySource(Bytes(blob), "layer");
  return extract::ExtractLayer(*src, dir, opts);
}

// Nothing but `dir`'s parent's expected children exist: no dir, no partial sibling.
std::vector<std::string> Children(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A hostile layer and the exact error it must produce.
struct HostileCase {
  std::string name;
  std::vector<TarEntry> entries;
  std::string error;  // expected message after "layer: "
  ExtractOptions options = {};
};

TarEntry Device(std::string path, TarType type, unsigned major, unsigned minor) {
  TarEntry e;
  e.path = std::move(path);
  e.type = type;
  e.dev_major = major;
  e.dev_minor = minor;
  e.mode = 0600;
  return e;
}

}  // namespace

TEST_CASE("extract: hostile tarballs are rejected precisely and write nothing outside") {
  TempDir tmp("shoal-extract-hostile");
  const std::string outside = tmp.Sub("outside");
  fs::create_directories(outside);
  WriteFile(outside + "/secret", "secret\n");
  const std::string work = tmp.Sub("work");
  fs::create_directories(work);

  ExtractOptions unprivileged;
  unprivileged.unprivileged = true;
  ExtractOptions few_entries;
  few_entries.max_entries = 10;
  ExtractOptions small_files;
  small_files.max_file_bytes = 1000;
  ExtractOptions small_layer;
  small_layer.max_total_bytes = 1500;
  ExtractOptions walk;
  walk.resolver = extract::Resolver::kWalk;

  std::vector<TarEntry> many;
  for (int i = 0; i < 11; ++i) many.push_back(FileEntry("f" + std::to_string(i), "x"));

  std::vector<HostileCase> cases = {
      {"dotdot", {FileEntry("../evil", "x")}, "entry \"../evil\": '..' component"},
      {"dotdot-deep",
       {DirEntry("a"), FileEntry("a/../../evil", "x")},
       "entry \"a/../../evil\": '..' component"},
      {"absolute", {FileEntry(outside + "/evil", "x")}, "entry \"" + outside + "/evil\": absolute path"},
      {"symlink-escape-absolute",
       {SymlinkEntry("link", outside), FileEntry("link/evil", "x")},
       "entry \"link/evil\": parent \"link\" leads outside the layer through a symlink"},
      {"symlink-escape-relative",
       {SymlinkEntry("link", "../../../../../../../../.." + outside), FileEntry("link/evil", "x")},
       "entry \"link/evil\": parent \"link\" leads outside the layer through a symlink"},
      {"symlink-chain-escape",
       {SymlinkEntry("a", "b"), SymlinkEntry("b", "c/../.."), DirEntry("c"),
        FileEntry("a/evil", "x")},
       "entry \"a/evil\": parent \"a\" leads outside the layer through a symlink"},
      {"symlink-escape-directory",
       {SymlinkEntry("link", outside), DirEntry("link/sub")},
       "entry \"link/sub/\": parent \"link\" leads outside the layer through a symlink"},
      {"hardlink-through-symlink",
       {SymlinkEntry("link", outside), HardlinkEntry("stolen", "link/secret")},
       "entry \"stolen\": hard link target \"link/secret\": parent \"link\" leads outside the "
       "layer through a symlink"},
      {"hardlink-absolute",
       {HardlinkEntry("stolen", outside + "/secret")},
       "entry \"stolen\": hard link target \"" + outside + "/secret\": absolute path"},
      {"hardlink-dotdot",
       {HardlinkEntry("stolen", "../outside/secret")},
       "entry \"stolen\": hard link target \"../outside/secret\": '..' component"},
      {"hardlink-missing",
       {HardlinkEntry("stolen", "nothere")},
       "entry \"stolen\": hard link target \"nothere\" is not in this layer"},
      {"device-unprivileged",
       {Device("dev/mem", TarType::kChar, 1, 1)},
       "entry \"dev/mem\": character device 1:1 refused: extraction is unprivileged",
       unprivileged},
      {"block-device-unprivileged",
       {Device("dev/sda", TarType::kBlock, 8, 0)},
       "entry \"dev/sda\": block device 8:0 refused: extraction is unprivileged",
       unprivileged},
      {"too-many-entries", many, "entry \"f10\": more than 10 entries in the layer", few_entries},
      {"file-too-large",
       {FileEntry("big", std::string(1001, 'b'))},
       "entry \"big\": file of 1001 bytes exceeds the limit of 1000",
       small_files},
      {"layer-too-large",
       {FileEntry("a", std::string(1000, 'a')), FileEntry("b", std::string(1000, 'b'))},
       "entry \"b\": layer data exceeds the limit of 1500 bytes",
       small_layer},
      {"path-too-long",
       {FileEntry(std::string(4100, 'p'), "x")},
       "entry \"" + std::string(4100, 'p') + "\": path longer than 4096 bytes"},
      {"name-too-long",
       {FileEntry("d/" + std::string(300, 'n'), "x")},
       "entry \"d/" + std::string(300, 'n') + "\": path component longer than 255 bytes"},
      {"replaces-root", {SymlinkEntry(".", "/")}, "entry \".\": entry replaces the layer root"},
      {"file-over-nonempty-dir",
       {DirEntry("d"), FileEntry("d/x", "x"), FileEntry("d", "y")},
       "entry \"d\": replaces a non-empty directory of the same layer"},
      {"whiteout-of-dotdot",
       {FileEntry(".wh...", "")},
       "entry \".wh...\": whiteout of an invalid name"},
      {"walk-refuses-any-symlink-parent",
       {DirEntry("real"), SymlinkEntry("alias", "real"), FileEntry("alias/x", "x")},
       "entry \"alias/x\": parent \"alias\" is a symlink (refused: openat2 is unavailable to "
       "check where it leads)",
       walk},
  };

  for (const HostileCase& c : cases) {
    CAPTURE(c.name);
    for (auto compression : {Compression::kNone, Compression::kGzip}) {
      const std::string target = work + "/" + c.name;
      auto r = ExtractBytes(Compress(BuildTar(c.entries), compression), target, c.options);
      REQUIRE_FALSE(r.has_value());
      CHECK(r.error().code == ErrorCode::kInvalidArgument);
      CHECK(r.error().message == "layer: " + c.error);
      // Not presented as complete, no partial tree left beside it, nothing written outside.
      CHECK(Children(work).empty());
      CHECK(Children(outside) == std::vector<std::string>{"secret"});
      CHECK(ReadFile(outside + "/secret") == "secret\n");
    }
  }
}

TEST_CASE("extract: a file entry over a symlink replaces the link and never writes through it") {
  TempDir tmp("shoal-extract-replace");
  const std::string outside = tmp.Sub("outside");
  fs::create_directories(outside);
  WriteFile(outside + "/target", "original\n");
  auto r = ExtractBytes(BuildTar({SymlinkEntry("link", outside + "/target"),
                                  FileEntry("link", "replaced\n"),
                                  SymlinkEntry("dirlink", outside), DirEntry("dirlink")}),
                        tmp.Sub("diff"));
  REQUIRE_MESSAGE(r.has_value(), Why(r));
  CHECK(ReadFile(outside + "/target") == "original\n");
  CHECK(ReadFile(tmp.Sub("diff/link")) == "replaced\n");
  CHECK(fs::is_directory(fs::symlink_status(tmp.Sub("diff/dirlink"))));
  CHECK(Children(outside) == std::vector<std::string>{"target"});
}

TEST_CASE("extract: symlinks inside the layer may be followed by later entries (openat2)") {
  TempDir tmp("shoal-extract-inside");
  auto r = ExtractBytes(BuildTar({DirEntry("usr/lib"), SymlinkEntry("lib", "usr/lib"),
                                  FileEntry("lib/libc.so", "elf")}),
                        tmp.Sub("diff"));
  REQUIRE_MESSAGE(r.has_value(), Why(r));
  CHECK(ReadFile(tmp.Sub("diff/usr/lib/libc.so")) == "elf");
}

TEST_CASE("extract: a corrupt or truncated stream fails clearly and leaves nothing") {
  TempDir tmp("shoal-extract-corrupt");
  std::vector<TarEntry> entries;
  for (int i = 0; i < 50; ++i) {
    entries.push_back(FileEntry("f" + std::to_string(i), std::string(20000, 'a' + i % 26)));
  }
  const std::string tar = BuildTar(entries);
  std::string gz = Compress(tar, Compression::kGzip);
  gz[gz.size() / 2] ^= 0x5a;
  gz[gz.size() / 2 + 1] ^= 0x5a;
  auto r = ExtractBytes(gz, tmp.Sub("gz"));
  REQUIRE_FALSE(r.has_value());
  CHECK_MESSAGE(r.error().message.rfind("gzip stream of layer: ", 0) == 0, r.error().message);
  std::string zs = Compress(tar, Compression::kZstd);
  auto rz = ExtractBytes(zs.substr(0, zs.size() / 2), tmp.Sub("zs"));
  REQUIRE_FALSE(rz.has_value());
  CHECK(rz.error().message ==
        "zstd stream of layer: truncated (ends inside a zstd frame) at compressed offset " +
            std::to_string(zs.size() / 2));
  auto rt = ExtractBytes(tar.substr(0, tar.size() / 2), tmp.Sub("tar"));
  REQUIRE_FALSE(rt.has_value());
  CHECK(rt.error().code == ErrorCode::kInvalidArgument);
  CHECK(rt.error().message.rfind("layer: ", 0) == 0);
  auto junk = ExtractBytes(std::string(5000, 'j'), tmp.Sub("junk"));
  REQUIRE_FALSE(junk.has_value());
  CHECK(junk.error().message.find("layer: ") == 0);
  CHECK(Children(tmp.path()).empty());
}

TEST_CASE("extract: plain tar, gzip, multi-member gzip and zstd give the same tree") {
  TempDir tmp("shoal-extract-formats");
  std::vector<TarEntry> entries = {DirEntry("etc"), FileEntry("etc/hosts", "127.0.0.1 x\n"),
                                   DirEntry("data")};
  for (int i = 0; i < 200; ++i) {
    entries.push_back(FileEntry("data/f" + std::to_string(i), std::string(i * 97, 'a' + i % 26)));
  }
  entries.push_back(FileEntry("big", std::string(3 << 20, 'z')));
  const std::string tar = BuildTar(entries);
  struct Form {
    std::string name;
    std::string blob;
    extract::Compression want;
  };
  std::vector<Form> forms = {
      {"tar", tar, extract::Compression::kNone},
      {"gzip", Compress(tar, Compression::kGzip), extract::Compression::kGzip},
      {"gzip3", Compress(tar, Compression::kGzip, 3), extract::Compression::kGzip},
      {"zstd", Compress(tar, Compression::kZstd), extract::Compression::kZstd},
  };
  Tree reference;
  for (const Form& f : forms) {
    CAPTURE(f.name);
    ExtractOptions opts;
    opts.expected_digest = Sha256::Of(f.blob);
    auto r = ExtractBytes(f.blob, tmp.Sub(f.name), opts);
    REQUIRE_MESSAGE(r.has_value(), Why(r));
    CHECK(r.value().compression == f.want);
    CHECK(r.value().raw_bytes == f.blob.size());
    CHECK(r.value().tar_bytes >= tar.size() - 1024);
    CHECK(r.value().files == 202);
    Tree t = SnapshotTree(tmp.Sub(f.name));
    if (reference.empty()) reference = t;
    CHECK(DiffTrees(reference, t) == std::vector<std::string>{});
  }
}

TEST_CASE("extract: bytes that do not hash to the expected digest are not committed") {
  TempDir tmp("shoal-extract-digest");
  const std::string blob = Compress(BuildTar({FileEntry("a", "a")}), Compression::kGzip);
  ExtractOptions opts;
  opts.expected_digest = Sha256::Of(std::string("something else"));
  auto r = ExtractBytes(blob, tmp.Sub("diff"), opts);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == ErrorCode::kDigestMismatch);
  CHECK(r.error().message == "layer: layer bytes hash to " + Sha256::Of(blob).str() +
                                 ", expected " + opts.expected_digest->str());
  CHECK(Children(tmp.path()).empty());
}

TEST_CASE("extract: the uncompressed stream must hash to the expected diff ID") {
  TempDir tmp("shoal-extract-diffid");
  // Blocks after the tar's end (docker and containerd write them too) belong to the diff ID.
  std::string tar = BuildTar({FileEntry("a", "a"), DirEntry("d")}) + std::string(4096, '\0');
  for (Compression c : {Compression::kNone, Compression::kGzip, Compression::kZstd}) {
    CAPTURE(static_cast<int>(c));
    const std::string blob = Compress(tar, c);
    const std::string name = "ok" + std::to_string(static_cast<int>(c));
    ExtractOptions opts;
    opts.expected_digest = Sha256::Of(blob);
    opts.expected_diff_id = Sha256::Of(tar);
    auto r = ExtractBytes(blob, tmp.Sub(name), opts);
    REQUIRE_MESSAGE(r.has_value(), Why(r));
    CHECK(r.value().files == 1);
    CHECK_FALSE(r.value().root_entry);
    opts.expected_diff_id = Sha256::Of(tar.substr(0, tar.size() - 512));
    auto bad = ExtractBytes(blob, tmp.Sub("bad"), opts);
    REQUIRE_FALSE(bad.has_value());
    CHECK(bad.error().code == ErrorCode::kDigestMismatch);
    CHECK(bad.error().message == "layer: uncompressed layer hashes to " + Sha256::Of(tar).str() +
                                     ", expected diff ID " + opts.expected_diff_id->str());
    CHECK_FALSE(fs::exists(tmp.Sub("bad")));
  }
  // A tar with an entry for the root says so.
  auto rooted = ExtractBytes(BuildTar({DirEntry("./", 0700), FileEntry("a", "a")}),
                             tmp.Sub("rooted"));
  REQUIRE_MESSAGE(rooted.has_value(), Why(rooted));
  CHECK(rooted.value().root_entry);
}

TEST_CASE("extract: a growing file is extracted as its bytes arrive") {
  TempDir tmp("shoal-extract-growing");
  std::vector<TarEntry> entries;
  uint32_t x = 7;
  for (int i = 0; i < 300; ++i) {
    std::string data(5000 + i, '\0');
    for (char& c : data) c = static_cast<char>((x = x * 1103515245 + 12345) >> 16);
    entries.push_back(FileEntry("d/f" + std::to_string(i), data));
  }
  const std::string blob = Compress(BuildTar(entries), Compression::kZstd);
  REQUIRE(blob.size() > 1000000);
  const std::string path = tmp.Sub("blob");
  WriteFile(path, "");

  std::mutex mu;
  std::condition_variable cv;
  uint64_t have = 0;  // GUARDED_BY(mu)
  bool failed = false;
  uint64_t waits = 0;
  bool blocked = false;  // GUARDED_BY(mu): the reader waits for bytes that are not there yet
  auto wait = [&](uint64_t want) -> Result<uint64_t> {
    std::unique_lock lk(mu);
    ++waits;
    blocked = have < want;
    cv.notify_all();
    cv.wait(lk, [&] { return have >= want || failed; });
    blocked = false;
    if (have >= want) return have;
    return MakeError(ErrorCode::kUnavailable, "download failed");
  };
  SUBCASE("complete") {
    // Lock-step, so the test does not depend on scheduling: each part is appended only once
    // the reader is blocked waiting for bytes that are not there yet.
    std::thread writer([&] {
      for (size_t off = 0; off < blob.size(); off += 7001) {
        {
          std::unique_lock lk(mu);
          cv.wait(lk, [&] { return blocked; });
        }
        std::string part = blob.substr(off, 7001);
        {
          std::ofstream f(path, std::ios::binary | std::ios::app);
          f << part;
        }
        {
          std::lock_guard lk(mu);
          have += part.size();
          blocked = false;  // the next part waits for the reader to ask again
        }
        cv.notify_all();
      }
    });
    auto src = extract::OpenGrowingFileSource(path, blob.size(), wait);
    REQUIRE(src.has_value());
    ExtractOptions opts;
    opts.expected_digest = Sha256::Of(blob);
    auto r = extract::ExtractLayer(*src.value(), tmp.Sub("diff"), opts);
    writer.join();
    REQUIRE_MESSAGE(r.has_value(), Why(r));
    CHECK(r.value().files == 300);
    CHECK(waits > 10);  // it really waited for bytes, many times
    auto whole = ExtractBytes(blob, tmp.Sub("whole"));
    REQUIRE(whole.has_value());
    // The tar has no entry for d/, so its mtime is the time it was made, which differs between
    // the two extractions (about one run in three crossed a tick): compare everything else.
    CHECK(DiffTrees(SnapshotTree(tmp.Sub("whole")), SnapshotTree(tmp.Sub("diff")),
                    /*compare_dir_mtimes=*/false)
              .empty());
  }
  SUBCASE("download fails midway") {
    WriteFile(path, blob.substr(0, blob.size() / 2));
    {
      std::lock_guard lk(mu);
      have = blob.size() / 2;
    }
    std::thread failer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      {
        std::lock_guard lk(mu);
        failed = true;
      }
      cv.notify_all();
    });
    auto src = extract::OpenGrowingFileSource(path, blob.size(), wait);
    REQUIRE(src.has_value());
    auto r = extract::ExtractLayer(*src.value(), tmp.Sub("diff"));
    failer.join();
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == ErrorCode::kUnavailable);
    CHECK(r.error().message == "download failed");
    CHECK_FALSE(fs::exists(tmp.Sub("diff")));
  }
}

namespace {

// Three layers exercising whiteouts, opaque dirs, metadata and every entry type umoci keeps.
std::vector<RawLayer> WhiteoutImageLayers() {
  TarEntry owned = FileEntry("home/user/notes", "mine\n", 0600);
  owned.uid = 1000;
  owned.gid = 1001;
  owned.xattrs = {{"user.note", "hello"}};
  TarEntry suid = FileEntry("usr/bin/tool", "#!/bin/sh\necho tool\n", 04755);
  TarEntry home = DirEntry("home/user", 0700);
  home.uid = 1000;
  home.gid = 1001;
  TarEntry old = FileEntry("data/old-mtime", "old\n");
  old.mtime = 1000000000;
  TarEntry fifo;
  fifo.path = "run/fifo";
  fifo.type = TarType::kFifo;
  fifo.mode = 0640;
  std::vector<TarEntry> l0 = {
      DirEntry("etc"), FileEntry("etc/passwd", "root:x:0:0::/root:/bin/sh\n"),
      DirEntry("usr"), DirEntry("usr/bin"), suid, SymlinkEntry("usr/bin/alias", "tool"),
      HardlinkEntry("usr/bin/tool2", "usr/bin/tool"), DirEntry("home", 0755), home, owned,
      DirEntry("data"), FileEntry("data/old1", "1"), FileEntry("data/old2", "2"), old,
      DirEntry("opq"), DirEntry("opq/inner"), FileEntry("opq/inner/a", "a"),
      FileEntry("opq/b", "b"), DirEntry("gone"), FileEntry("gone/file", "gone"),
      DirEntry("run"), fifo, DirEntry("dev"), Device("dev/null", TarType::kChar, 1, 3)};
  TarEntry passwd2 = FileEntry("etc/passwd", "root:x:0:0::/root:/bin/bash\n");
  TarEntry tool_mode = FileEntry("usr/bin/tool", "#!/bin/sh\necho tool v2\n", 0700);
  std::vector<TarEntry> l1 = {
      FileEntry(".wh.gone", ""), DirEntry("data"), FileEntry("data/.wh.old1", ""),
      DirEntry("opq"), FileEntry("opq/.wh..wh..opq", ""), FileEntry("opq/new", "new"),
      DirEntry("etc"), passwd2, DirEntry("usr"), DirEntry("usr/bin"), tool_mode};
  std::vector<TarEntry> l2 = {
      DirEntry("gone", 0750), FileEntry("gone/back", "back"), DirEntry("data"),
      SymlinkEntry("data/old1", "old2"), FileEntry("data/.wh.old-mtime", ""),
      FileEntry("newfile", "n", 0444)};
  // umoci 0.4 (Debian 12) unpacks gzip and plain tar layers, not zstd.
  return {RawLayer{BuildTar(l0), Compression::kGzip, 1},
          RawLayer{BuildTar(l1), Compression::kNone, 1},
          RawLayer{BuildTar(l2), Compression::kGzip, 3}};
}

std::vector<extract::LayerInput> LayoutInputs(const BuiltImage& img) {
  std::vector<extract::LayerInput> inputs;
  for (size_t i = 0; i < img.layer_digests.size(); ++i) {
    std::string path = img.layout_dir + "/blobs/sha256/" + img.layer_digests[i].hex();
    inputs.push_back({.digest = img.layer_digests[i],
                      .size_hint = img.layer_sizes[i],
                      .open = [path] { return extract::OpenFileSource(path); },
                      .verify = true});
  }
  return inputs;
}

std::vector<Tree> LayerTrees(const std::vector<extract::LayerResult>& layers) {
  std::vector<Tree> trees;
  for (const auto& l : layers) trees.push_back(SnapshotTree(l.diff_dir));
  return trees;
}

// umoci's view of the image: its rootfs (mtimes of directories are not restored by umoci once
// their contents change, so directories' mtimes are not compared).
Tree UmociRootfs(const BuiltImage& img, const std::string& bundle) {
  auto out = RunCommand({"umoci", "unpack", "--image", img.layout_dir + ":" + img.tag, bundle});
  REQUIRE_MESSAGE(out.has_value(), Why(out));
  Tree t = SnapshotTree(bundle + "/rootfs");
  for (auto& [p, n] : t) n.hardlink_group.clear();
  return t;
}

}  // namespace

TEST_CASE("extract: whiteouts and metadata match umoci's unpack of the same image") {
  TempDir tmp("shoal-extract-umoci");
  auto img = WriteOciImage(tmp.Sub("layout"), "1", WhiteoutImageLayers());
  REQUIRE_MESSAGE(img.has_value(), Why(img));
  auto layers = extract::ExtractImage(tmp.Sub("root"), LayoutInputs(img.value()));
  REQUIRE_MESSAGE(layers.has_value(), Why(layers));
  REQUIRE(layers.value().size() == 3);

  // The overlay forms on disk.
  const auto& l1 = layers.value()[1];
  struct stat st {};
  REQUIRE(::lstat((l1.diff_dir + "/gone").c_str(), &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  CHECK(st.st_rdev == makedev(0, 0));
  Tree t1 = SnapshotTree(l1.diff_dir);
  CHECK(t1["opq"].xattrs == std::map<std::string, std::string>{{"trusted.overlay.opaque", "y"}});
  CHECK(l1.stats.whiteouts == 2);
  CHECK(l1.stats.opaque_dirs == 1);
  CHECK_FALSE(t1.count("opq/.wh..wh..opq"));
  // Owners, modes, xattrs, hard links as in the tar.
  Tree t0 = SnapshotTree(layers.value()[0].diff_dir);
  CHECK(t0["home/user/notes"].uid == 1000);
  CHECK(t0["home/user/notes"].gid == 1001);
  CHECK(t0["home/user/notes"].mode == 0600);
  CHECK(t0["home/user/notes"].xattrs.at("user.note") == "hello");
  CHECK(t0["home/user"].mode == 0700);
  CHECK(t0["usr/bin/tool"].mode == 04755);
  CHECK(t0["usr/bin/tool2"].hardlink_group == "usr/bin/tool");
  CHECK(t0["usr/bin/alias"].link == "tool");
  CHECK(t0["data/old-mtime"].mtime == 1000000000);
  CHECK(t0["dev/null"].type == 'c');
  CHECK(t0["run/fifo"].type == 'p');

  Tree merged = MergeLayers(LayerTrees(layers.value()));
  Tree reference = UmociRootfs(img.value(), tmp.Sub("bundle"));
  CHECK(DiffTrees(reference, merged, /*compare_dir_mtimes=*/false) == std::vector<std::string>{});
  CHECK_FALSE(merged.count("gone/file"));
  CHECK(merged.count("gone/back"));
  CHECK_FALSE(merged.count("opq/inner"));
  CHECK(merged.count("opq/new"));

  // The kernel agrees, when this environment lets us mount overlayfs.
  const std::string mnt = tmp.Sub("mnt");
  fs::create_directories(mnt);
  const std::string opts = "lowerdir=" + extract::LowerDirOption(layers.value());
  if (::mount("overlay", mnt.c_str(), "overlay", MS_RDONLY, opts.c_str()) == 0) {
    Tree mounted = SnapshotTree(mnt);
    ::umount(mnt.c_str());
    for (auto& [p, n] : mounted) n.hardlink_group.clear();
    CHECK(DiffTrees(reference, mounted, false) == std::vector<std::string>{});
  } else {
    MESSAGE("overlayfs mount not permitted here (" << std::strerror(errno) << "); skipped");
  }

  // The overlay2 bookkeeping.
  const std::string root = tmp.Sub("root");
  CHECK(ReadFile(root + "/" + layers.value()[0].id + "/link") == layers.value()[0].short_id);
  CHECK_FALSE(fs::exists(root + "/" + layers.value()[0].id + "/lower"));
  CHECK(ReadFile(root + "/" + layers.value()[2].id + "/lower") ==
        "l/" + layers.value()[1].short_id + ":l/" + layers.value()[0].short_id);
  CHECK(fs::is_directory(root + "/" + layers.value()[2].id + "/work"));
  CHECK(fs::read_symlink(root + "/l/" + layers.value()[1].short_id) ==
        "../" + layers.value()[1].id + "/diff");
}

TEST_CASE("extract: the unprivileged whiteout form (explicit option) gives the same merged view") {
  TempDir tmp("shoal-extract-userxattr");
  auto img = WriteOciImage(tmp.Sub("layout"), "1", WhiteoutImageLayers());
  REQUIRE(img.has_value());
  extract::ImageExtractOptions opts;
  opts.layer.whiteouts = extract::WhiteoutMode::kUser;
  auto layers = extract::ExtractImage(tmp.Sub("root"), LayoutInputs(img.value()), opts);
  REQUIRE_MESSAGE(layers.has_value(), Why(layers));
  Tree t1 = SnapshotTree(layers.value()[1].diff_dir);
  REQUIRE(t1.count(".wh.gone"));
  CHECK(t1[".wh.gone"].type == 'f');
  CHECK(t1[".wh.gone"].size == 0);
  CHECK(t1[".wh.gone"].mode == 0);
  CHECK_FALSE(t1.count("gone"));
  CHECK(t1["opq"].xattrs == std::map<std::string, std::string>{{"user.overlay.opaque", "y"}});
  Tree merged = MergeLayers(LayerTrees(layers.value()));
  Tree reference = UmociRootfs(img.value(), tmp.Sub("bundle"));
  CHECK(DiffTrees(reference, merged, false) == std::vector<std::string>{});
}

TEST_CASE("extract: xattrs naming overlay's own attributes are dropped from layers") {
  TempDir tmp("shoal-extract-forged");
  TarEntry d = DirEntry("d");
  d.xattrs = {{"trusted.overlay.opaque", "y"}, {"user.overlay.opaque", "y"}, {"user.ok", "1"}};
  auto r = ExtractBytes(BuildTar({d}), tmp.Sub("diff"));
  REQUIRE_MESSAGE(r.has_value(), Why(r));
  CHECK(r.value().xattrs_dropped > 0);
  Tree t = SnapshotTree(tmp.Sub("diff"));
  CHECK(t["d"].xattrs == std::map<std::string, std::string>{{"user.ok", "1"}});
}

TEST_CASE("extract: parallel extraction equals sequential extraction, file for file") {
  TempDir tmp("shoal-extract-parallel");
  ImageSpec spec;
  spec.layers = {
      LayerSpec{.compression = Compression::kGzip, .small_files = 400, .big_files = {8 << 20}, .seed = 11},
      LayerSpec{.compression = Compression::kZstd, .small_files = 300, .seed = 12, .with_whiteout = true},
      LayerSpec{.compression = Compression::kNone, .small_files = 100, .big_files = {3 << 20}, .seed = 13},
      LayerSpec{.compression = Compression::kGzip, .small_files = 200, .seed = 14, .with_whiteout = true},
  };
  auto img = BuildImage(spec, tmp.Sub("layout"), "1");
  REQUIRE_MESSAGE(img.has_value(), Why(img));
  // Plus the hand-made layers with owners, xattrs, devices and whiteouts.
  auto extra = WriteOciImage(tmp.Sub("layout2"), "1", WhiteoutImageLayers());
  REQUIRE(extra.has_value());
  auto inputs = LayoutInputs(img.value());
  auto more = LayoutInputs(extra.value());
  inputs.insert(inputs.end(), more.begin(), more.end());

  extract::ImageExtractOptions parallel;
  parallel.parallelism = 0;
  std::mutex mu;
  std::set<std::thread::id> threads;
  parallel.on_layer_done = [&](size_t, const Result<LayerStats>&) {
    std::lock_guard lk(mu);
    threads.insert(std::this_thread::get_id());
  };
  extract::ImageExtractOptions sequential;
  sequential.parallelism = 1;
  auto a = extract::ExtractImage(tmp.Sub("par"), inputs, parallel);
  REQUIRE_MESSAGE(a.has_value(), Why(a));
  auto b = extract::ExtractImage(tmp.Sub("seq"), inputs, sequential);
  REQUIRE_MESSAGE(b.has_value(), Why(b));
  if (std::thread::hardware_concurrency() > 1) CHECK(threads.size() > 1);
  REQUIRE(a.value().size() == b.value().size());
  for (size_t i = 0; i < a.value().size(); ++i) {
    CAPTURE(i);
    CHECK(a.value()[i].id == b.value()[i].id);
    Tree ta = SnapshotTree(a.value()[i].diff_dir);
    Tree tb = SnapshotTree(b.value()[i].diff_dir);
    CHECK(ta.size() > 3);
    auto diffs = DiffTrees(ta, tb);
    for (size_t k = 0; k < diffs.size() && k < 5; ++k) MESSAGE(diffs[k]);
    CHECK(diffs.empty());
  }
  CHECK(Children(tmp.Sub("par")) == Children(tmp.Sub("seq")));

  // Extracting again reuses every layer.
  auto again = extract::ExtractImage(tmp.Sub("par"), inputs, parallel);
  REQUIRE(again.has_value());
  for (const auto& l : again.value()) CHECK(l.reused);
}

TEST_CASE("extract: one hostile layer fails the image, the good layers stay, the bad leaves nothing") {
  TempDir tmp("shoal-extract-image-fail");
  auto img = WriteOciImage(
      tmp.Sub("layout"), "1",
      {RawLayer{BuildTar({FileEntry("ok", "ok")}), Compression::kGzip, 1},
       RawLayer{BuildTar({SymlinkEntry("l", "/"), FileEntry("l/evil", "x")}), Compression::kZstd, 1},
       RawLayer{BuildTar({FileEntry("ok2", "ok")}), Compression::kNone, 1}});
  REQUIRE(img.has_value());
  const std::string root = tmp.Sub("root");
  auto r = extract::ExtractImage(root, LayoutInputs(img.value()));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message == "layer 1 (" + img.value().layer_digests[1].str() + "): file " +
                                 img.value().layout_dir + "/blobs/sha256/" +
                                 img.value().layer_digests[1].hex() +
                                 ": entry \"l/evil\": parent \"l\" leads outside the layer "
                                 "through a symlink");
  auto ids = extract::LayerChainIds(img.value().layer_digests);
  CHECK(fs::exists(root + "/" + ids[0] + "/diff/ok"));
  CHECK(fs::exists(root + "/" + ids[2] + "/diff/ok2"));
  CHECK_FALSE(fs::exists(root + "/" + ids[1]));
  std::vector<std::string> want = {"l", ids[0], ids[2]};
  std::sort(want.begin(), want.end());
  CHECK(Children(root) == want);
  CHECK_FALSE(fs::exists("/evil"));
}

}  // namespace shoal::testkit
