#include "snapshotter/service.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "containerd/services/snapshots/v1/snapshots.grpc.pb.h"
#include "snapshotter/filter.h"

namespace shoal::snapshotter {
namespace {

namespace api = containerd::services::snapshots::v1;
using google::protobuf::Empty;

// How many infos one List message carries: containerd's own server sends batches too, so a
// long list never makes one oversized message.
constexpr int kListBatch = 100;

grpc::Status ToStatus(const StoreError& e) {
  switch (e.code) {
    case Errc::kNotFound: return {grpc::StatusCode::NOT_FOUND, e.message};
    case Errc::kAlreadyExists: return {grpc::StatusCode::ALREADY_EXISTS, e.message};
    case Errc::kFailedPrecondition: return {grpc::StatusCode::FAILED_PRECONDITION, e.message};
    case Errc::kInvalidArgument: return {grpc::StatusCode::INVALID_ARGUMENT, e.message};
    case Errc::kIo: return {grpc::StatusCode::INTERNAL, e.message};
  }
  return {grpc::StatusCode::INTERNAL, e.message};
}

// The answer for a failed call, logged by how surprising it is: containerd asks for snapshots
// that do not exist (Stat before Prepare) and races on keys as a matter of course.
grpc::Status Fail(const char* call, const StoreError& e) {
  if (e.code == Errc::kNotFound || e.code == Errc::kAlreadyExists) {
    spdlog::debug("snapshotter {}: {}", call, e.ToString());
  } else {
    spdlog::warn("snapshotter {}: {}", call, e.ToString());
  }
  return ToStatus(e);
}

Labels FromProto(const google::protobuf::Map<std::string, std::string>& m) {
  return Labels(m.begin(), m.end());
}

void ToProto(const std::vector<Mount>& mounts,
             google::protobuf::RepeatedPtrField<containerd::types::Mount>* out) {
  for (const Mount& m : mounts) {
    containerd::types::Mount* pm = out->Add();
    pm->set_type(m.type);
    pm->set_source(m.source);
    for (const std::string& o : m.options) pm->add_options(o);
  }
}

void ToProto(std::chrono::system_clock::time_point t, google::protobuf::Timestamp* out) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  int64_t secs = ns / 1000000000;
  int64_t rem = ns % 1000000000;
  if (rem < 0) {
    rem += 1000000000;
    secs -= 1;
  }
  out->set_seconds(secs);
  out->set_nanos(static_cast<int32_t>(rem));
}

void ToProto(const Info& info, api::Info* out) {
  out->set_name(info.name);
  out->set_parent(info.parent);
  switch (info.kind) {
    case Kind::kView: out->set_kind(api::VIEW); break;
    case Kind::kActive: out->set_kind(api::ACTIVE); break;
    case Kind::kCommitted: out->set_kind(api::COMMITTED); break;
  }
  ToProto(info.created, out->mutable_created_at());
  ToProto(info.updated, out->mutable_updated_at());
  out->mutable_labels()->insert(info.labels.begin(), info.labels.end());
}

class SnapshotsService final : public api::Snapshots::Service {
 public:
  SnapshotsService(Store& store, LayerPrep* prep) : store_(store), prep_(prep) {}

  grpc::Status Prepare(grpc::ServerContext*, const api::PrepareSnapshotRequest* req,
                       api::PrepareSnapshotResponse* resp) override {
    Labels labels = FromProto(req->labels());
    if (prep_ && LayerPrep::Wants(labels)) {
      // containerd's unpacker: shoal fetches and extracts the layer itself if it can; the
      // AlreadyExists answer makes containerd skip its own fetch and unpack (metadata/
      // snapshot.go then finds the snapshot by its target label and parent).
      const std::string& target = labels.at(kTargetLabel);
      PrepareOutcome out = prep_->TryPrepare(req->key(), req->parent(), labels);
      if (out.prepared) {
        spdlog::info("snapshotter: prepared layer {} for \"{}\"", target, req->key());
        return {grpc::StatusCode::ALREADY_EXISTS, "target snapshot \"" + target + "\": already exists"};
      }
      spdlog::info("snapshotter: layer {} left to containerd: {}", target, out.reason);
    }
    auto mounts = store_.Prepare(req->key(), req->parent(), labels);
    if (!mounts) return Fail("prepare", mounts.error());
    spdlog::debug("snapshotter: prepared \"{}\" on \"{}\"", req->key(), req->parent());
    ToProto(mounts.value(), resp->mutable_mounts());
    return grpc::Status::OK;
  }

  grpc::Status View(grpc::ServerContext*, const api::ViewSnapshotRequest* req,
                    api::ViewSnapshotResponse* resp) override {
    auto mounts = store_.View(req->key(), req->parent(), FromProto(req->labels()));
    if (!mounts) return Fail("view", mounts.error());
    spdlog::debug("snapshotter: view \"{}\" of \"{}\"", req->key(), req->parent());
    ToProto(mounts.value(), resp->mutable_mounts());
    return grpc::Status::OK;
  }

  grpc::Status Mounts(grpc::ServerContext*, const api::MountsRequest* req,
                      api::MountsResponse* resp) override {
    auto mounts = store_.Mounts(req->key());
    if (!mounts) return Fail("mounts", mounts.error());
    ToProto(mounts.value(), resp->mutable_mounts());
    return grpc::Status::OK;
  }

  grpc::Status Commit(grpc::ServerContext*, const api::CommitSnapshotRequest* req,
                      Empty*) override {
    auto st = store_.Commit(req->name(), req->key(), FromProto(req->labels()));
    if (!st) return Fail("commit", st.error());
    spdlog::debug("snapshotter: committed \"{}\" as \"{}\"", req->key(), req->name());
    return grpc::Status::OK;
  }

  grpc::Status Remove(grpc::ServerContext*, const api::RemoveSnapshotRequest* req,
                      Empty*) override {
    auto st = store_.Remove(req->key());
    if (!st) return Fail("remove", st.error());
    spdlog::debug("snapshotter: removed \"{}\"", req->key());
    return grpc::Status::OK;
  }

  grpc::Status Stat(grpc::ServerContext*, const api::StatSnapshotRequest* req,
                    api::StatSnapshotResponse* resp) override {
    auto info = store_.Stat(req->key());
    if (!info) return Fail("stat", info.error());
    ToProto(info.value(), resp->mutable_info());
    return grpc::Status::OK;
  }

  grpc::Status Update(grpc::ServerContext*, const api::UpdateSnapshotRequest* req,
                      api::UpdateSnapshotResponse* resp) override {
    Info info;
    info.name = req->info().name();
    info.labels = FromProto(req->info().labels());
    std::vector<std::string> paths(req->update_mask().paths().begin(),
                                   req->update_mask().paths().end());
    auto updated = store_.Update(info, paths);
    if (!updated) return Fail("update", updated.error());
    ToProto(updated.value(), resp->mutable_info());
    return grpc::Status::OK;
  }

  grpc::Status List(grpc::ServerContext*, const api::ListSnapshotsRequest* req,
                    grpc::ServerWriter<api::ListSnapshotsResponse>* writer) override {
    std::vector<Filter> filters;
    for (const std::string& text : req->filters()) {
      auto f = Filter::Parse(text);
      if (!f) return Fail("list", f.error());
      filters.push_back(std::move(f.value()));
    }
    api::ListSnapshotsResponse batch;
    for (const Info& info : store_.List()) {
      if (!filters.empty() && !MatchesAny(filters, info)) continue;
      ToProto(info, batch.add_info());
      if (batch.info_size() >= kListBatch) {
        if (!writer->Write(batch)) return {grpc::StatusCode::CANCELLED, "list: client went away"};
        batch.Clear();
      }
    }
    if (batch.info_size() > 0 && !writer->Write(batch)) {
      return {grpc::StatusCode::CANCELLED, "list: client went away"};
    }
    return grpc::Status::OK;
  }

  grpc::Status Usage(grpc::ServerContext*, const api::UsageRequest* req,
                     api::UsageResponse* resp) override {
    auto usage = store_.GetUsage(req->key());
    if (!usage) return Fail("usage", usage.error());
    resp->set_size(usage.value().size);
    resp->set_inodes(usage.value().inodes);
    return grpc::Status::OK;
  }

  grpc::Status Cleanup(grpc::ServerContext*, const api::CleanupRequest*, Empty*) override {
    auto removed = store_.Cleanup();
    if (!removed) return Fail("cleanup", removed.error());
    if (removed.value() > 0) {
      spdlog::info("snapshotter cleanup: removed {} unreferenced directories", removed.value());
    }
    return grpc::Status::OK;
  }

 private:
  Store& store_;
  LayerPrep* prep_;
};

}  // namespace

struct Server::Impl {
  Impl(Store& store, LayerPrep* prep) : service(store, prep) {}
  SnapshotsService service;
  std::unique_ptr<grpc::Server> server;
  std::mutex mu;
  bool stopped = false;  // GUARDED_BY(mu)
};

Server::Server(std::string socket_path, std::unique_ptr<Impl> impl)
    : socket_path_(std::move(socket_path)), impl_(std::move(impl)) {}

Server::~Server() { Stop(); }

Result<std::unique_ptr<Server>> Server::Start(Store& store, const std::string& socket_path,
                                              LayerPrep* prep) {
  namespace fs = std::filesystem;
  if (socket_path.empty()) {
    return MakeError(ErrorCode::kInvalidArgument, "snapshotter socket: empty path");
  }
  if (socket_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "snapshotter socket " + socket_path + " is longer than a unix socket path " +
                         "may be (" + std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) +
                         " bytes)");
  }
  std::error_code ec;
  fs::path parent = fs::path(socket_path).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) {
      return MakeError(ErrorCode::kIo, "snapshotter socket: create " + parent.string() + ": " +
                                           ec.message());
    }
  }
  // A socket left by an agent that was killed is ours to replace; anything else is not.
  struct stat st;
  if (::lstat(socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "snapshotter socket " + socket_path + " exists and is not a socket");
    }
    if (::unlink(socket_path.c_str()) != 0) {
      return MakeError(ErrorCode::kIo, "snapshotter socket: remove stale " + socket_path + ": " +
                                           std::strerror(errno));
    }
  }
  auto impl = std::make_unique<Impl>(store, prep);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_path, grpc::InsecureServerCredentials());
  builder.RegisterService(&impl->service);
  impl->server = builder.BuildAndStart();
  if (!impl->server) {
    return MakeError(ErrorCode::kUnavailable,
                     "snapshotter: gRPC could not listen on unix:" + socket_path);
  }
  // Only this user (root on a node, as containerd) may drive the snapshotter.
  if (::chmod(socket_path.c_str(), 0600) != 0) {
    int err = errno;
    impl->server->Shutdown();
    ::unlink(socket_path.c_str());
    return MakeError(ErrorCode::kIo,
                     "snapshotter socket: chmod " + socket_path + ": " + std::strerror(err));
  }
  return std::unique_ptr<Server>(new Server(socket_path, std::move(impl)));
}

void Server::Stop(std::chrono::milliseconds grace) {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
  impl_->server->Wait();
  ::unlink(socket_path_.c_str());
}

}  // namespace shoal::snapshotter
