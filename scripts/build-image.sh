#!/usr/bin/env bash
# Builds shoal's container image (Containerfile) with podman, without any container registry:
#   1. the base image (Debian 12, slim) from Debian packages with mmdebstrap, tagged with the
#      name the Containerfile starts from (BASE_IMAGE), in a podman store of this build's own;
#   2. `podman build` (the build stage compiles the release preset; apt-get inside reaches the
#      same Debian archive as the host);
#   3. an OCI archive (ctr import, skopeo copy oci-archive:...) and a docker archive
#      (docker load) under build/image/.
# Prints the image's size and how long each step took. Heavy (compiles the whole project):
# runs under nice. Usage: scripts/build-image.sh [--fresh-base] [--jobs N]
set -euo pipefail
cd "$(dirname "$0")/.."

FRESH_BASE=0
JOBS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --fresh-base) FRESH_BASE=1 ;;
    --jobs) JOBS="$2"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

OUT="${SHOAL_IMAGE_DIR:-$PWD/build/image}"
BASE_IMAGE="docker.io/library/debian:bookworm-slim"   # the Containerfile's default BASE_IMAGE
VERSION="$(sed -n 's/^project(shoal VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)"
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then REVISION="$REVISION-dirty"; fi
SOURCE="$(git config --get remote.origin.url 2>/dev/null || true)"
IMAGE="localhost/shoal:$VERSION"
mkdir -p "$OUT"

# podman as it runs on these machines: runc, cgroupfs, ulimits within the shell's hard limit;
# and a store of this build's own, so the host's images are neither seen nor changed.
cat > "$OUT/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_CONF="$OUT/containers.conf"
podman_() {
  nice -n 10 \
  podman --root "$OUT/storage" --runroot "$OUT/run" --storage-driver overlay "$@"
}

t0=$(date +%s)
BASE_TAR="$OUT/debian-bookworm-slim.tar"
if [ "$FRESH_BASE" = 1 ] || [ ! -f "$BASE_TAR" ] || [ ! -s "$BASE_TAR" ]; then
  echo "build-image: mmdebstrap bookworm -> $BASE_TAR"
  rm -rf "$BASE_TAR.tmp"
  # --format=tar: mmdebstrap picks the format from the target's extension, and ".tmp" would
  # make it a directory.
  nice -n 10 mmdebstrap --variant=apt --format=tar --include=ca-certificates \
    --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    bookworm "$BASE_TAR.tmp" http://deb.debian.org/debian
  mv "$BASE_TAR.tmp" "$BASE_TAR"
fi
podman_ import --change 'CMD ["/bin/bash"]' "$BASE_TAR" "$BASE_IMAGE" >/dev/null
t1=$(date +%s)
echo "build-image: base $BASE_IMAGE ready ($((t1 - t0)) s)"

podman_ build --pull=never --layers \
  --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "JOBS=$JOBS" \
  --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "SOURCE=$SOURCE" \
  --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  -f Containerfile -t "$IMAGE" .
t2=$(date +%s)
echo "build-image: built $IMAGE ($((t2 - t1)) s)"

rm -f "$OUT/shoal-$VERSION.oci.tar" "$OUT/shoal-$VERSION.docker.tar"
podman_ save --format oci-archive -o "$OUT/shoal-$VERSION.oci.tar" "$IMAGE"
podman_ save --format docker-archive -o "$OUT/shoal-$VERSION.docker.tar" "$IMAGE"
t3=$(date +%s)

size=$(podman_ image inspect --format '{{.Size}}' "$IMAGE")
echo "build-image: $IMAGE: $((size / 1024 / 1024)) MiB uncompressed"
echo "build-image: $(du -m "$OUT/shoal-$VERSION.oci.tar" | cut -f1) MiB $OUT/shoal-$VERSION.oci.tar (ctr import, skopeo copy oci-archive:...)"
echo "build-image: $(du -m "$OUT/shoal-$VERSION.docker.tar" | cut -f1) MiB $OUT/shoal-$VERSION.docker.tar (docker load)"
echo "build-image: times: base $((t1 - t0)) s, build $((t2 - t1)) s, archives $((t3 - t2)) s"
