#!/usr/bin/python3
# PullImage (then RemoveImage) over the CRI, as the kubelet calls it, for
# tests/probe/mirror-auth-probe.sh (a probe, not shipped code). Needs only python3-grpcio
# (Debian); the two messages are encoded by hand (k8s.io/cri-api runtime/v1 field numbers):
#   PullImageRequest{1: ImageSpec{1: image}, 2: AuthConfig{1: username, 2: password,
#                    3: auth, 4: server_address, ...}}
# The kubelet fills AuthConfig from the pod's imagePullSecrets: username and password of the
# matching entry, with server_address empty (its keyring does not set it).
#   cri-pull.py SOCKET IMAGE [USERNAME PASSWORD [SERVER_ADDRESS]]
import sys
import grpc


def field(num, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    n, out = len(payload), b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            break
    return bytes([num << 3 | 2]) + out + payload


sock, image = sys.argv[1], sys.argv[2]
auth = b""
if len(sys.argv) > 4:
    auth = field(1, sys.argv[3]) + field(2, sys.argv[4])
    if len(sys.argv) > 5:
        auth += field(4, sys.argv[5])
spec = field(1, field(1, image))
req = spec + (field(2, auth) if auth else b"")
ch = grpc.insecure_channel("unix://" + sock)
ident = lambda b: b
pull = ch.unary_unary("/runtime.v1.ImageService/PullImage", request_serializer=ident,
                      response_deserializer=ident)
remove = ch.unary_unary("/runtime.v1.ImageService/RemoveImage", request_serializer=ident,
                        response_deserializer=ident)
try:
    resp = pull(req, timeout=240)
except grpc.RpcError as e:
    print("PullImage failed: %s: %s" % (e.code(), e.details()))
    sys.exit(1)
print("PullImage ok: image_ref %s" % resp[2:].decode(errors="replace"))
try:
    remove(spec, timeout=60)
except grpc.RpcError as e:
    print("RemoveImage failed: %s" % e.details())
