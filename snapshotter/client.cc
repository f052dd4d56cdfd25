#include "snapshotter/client.h"

#include <grpcpp/grpcpp.h>

#include "containerd/services/snapshots/v1/snapshots.grpc.pb.h"

namespace shoal::snapshotter {

Result<size_t> CountSnapshots(const std::string& socket_path, std::chrono::milliseconds timeout) {
  namespace api = containerd::services::snapshots::v1;
  auto channel = grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
  auto stub = api::Snapshots::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  api::ListSnapshotsRequest req;
  req.set_snapshotter("shoal");
  auto reader = stub->List(&ctx, req);
  api::ListSnapshotsResponse batch;
  size_t n = 0;
  while (reader->Read(&batch)) n += static_cast<size_t>(batch.info_size());
  grpc::Status st = reader->Finish();
  if (!st.ok()) {
    return MakeError(ErrorCode::kUnavailable,
                     "the snapshots API's List on " + socket_path + " failed: gRPC code " +
                         std::to_string(st.error_code()) + ": " + st.error_message());
  }
  return n;
}

}  // namespace shoal::snapshotter
