#include "tests/support/cri.h"

#include <grpcpp/grpcpp.h>

#include "cri/api.grpc.pb.h"

namespace shoal::testkit {

Result<std::string> CriPullImage(const std::string& socket, const std::string& image,
                                 std::chrono::seconds timeout) {
  auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  auto stub = runtime::v1::ImageService::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  runtime::v1::PullImageRequest req;
  req.mutable_image()->set_image(image);
  runtime::v1::PullImageResponse resp;
  grpc::Status st = stub->PullImage(&ctx, req, &resp);
  if (!st.ok()) {
    return MakeError(ErrorCode::kUnavailable, "CRI PullImage " + image + ": gRPC code " +
                                                  std::to_string(st.error_code()) + ": " +
                                                  st.error_message());
  }
  return resp.image_ref();
}

}  // namespace shoal::testkit
