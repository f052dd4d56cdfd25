#!/usr/bin/env python3
# A stand-in registry mirror for tests/probe/mirror-auth-probe.sh (a probe, not shipped code).
# Every /v2/... request gets 401 UNAUTHORIZED with the chosen challenge; /token (the Bearer
# realm) logs what it gets and hands out a token, so a client that follows the challenge shows
# which credentials it sends where. Every request line and header is appended to LOG.
#   mirror-standin.py PORT basic|bearer|basic-v2ok LOG [REALM_PORT]
# basic-v2ok answers GET /v2/ with 200 (as the shim does) and challenges only manifests and
# blobs: does the client still send credentials when the ping did not ask for them?
# REALM_PORT (default PORT) is the port in the Bearer realm URL: the logging proxy's, so that the
# token request is recorded too and goes to the host the client knows as the mirror.
import http.server, json, sys, threading

PORT, MODE, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3]
REALM_PORT = int(sys.argv[4]) if len(sys.argv) > 4 else PORT
lock = threading.Lock()


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def record(self, status, extra=""):
        with lock, open(LOG, "a") as f:
            f.write("> %s\n" % self.requestline)
            for k, v in self.headers.items():
                f.write(">   %s: %s\n" % (k, v))
            f.write("< %d %s\n" % (status, extra))

    def answer(self, status, headers, body):
        b = body.encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.send_header("Docker-Distribution-Api-Version", "registry/2.0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b)

    def do_GET(self):
        if self.path.startswith("/token"):
            self.record(200, "(token issued)")
            self.answer(200, [], json.dumps({"token": "standin-token", "access_token": "standin-token",
                                             "expires_in": 300}))
            return
        if MODE == "basic-v2ok" and self.path.split("?")[0] in ("/v2/", "/v2"):
            self.record(200)
            self.answer(200, [], "{}")
            return
        if MODE in ("basic", "basic-v2ok"):
            challenge = 'Basic realm="shoal-standin"'
        else:
            challenge = 'Bearer realm="http://127.0.0.1:%d/token",service="shoal-standin"' % REALM_PORT
            parts = self.path.split("?")[0].split("/")
            for marker in ("manifests", "blobs"):
                if marker in parts:
                    name = "/".join(parts[2:parts.index(marker)])
                    challenge += ',scope="repository:%s:pull"' % name
        self.record(401, "WWW-Authenticate: " + challenge)
        self.answer(401, [("WWW-Authenticate", challenge)],
                    json.dumps({"errors": [{"code": "UNAUTHORIZED", "message": "authentication required",
                                            "detail": None}]}))

    do_HEAD = do_GET

    def do_POST(self):  # containerd asks for tokens with an OAuth2 form (POST) first
        n = int(self.headers.get("Content-Length") or 0)
        form = self.rfile.read(n).decode(errors="replace") if n else ""
        self.record(200, "(token issued) body: " + form)
        self.answer(200, [], json.dumps({"token": "standin-token", "access_token": "standin-token",
                                         "expires_in": 300}))


http.server.ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
