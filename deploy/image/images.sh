#!/usr/bin/env bash
# make images: builds the binaries of Bulkhead's three images with the
# pinned Go release, then the images (deploy/image/build) into bin/images:
#   bulkhead-webhook.oci.tar         the admission webhook (nonroot 65532)
#   bulkhead-node-agent.oci.tar      the node agent (the DaemonSet's agent)
#   bulkhead-node-installer.oci.tar  the host binaries and install.sh
#   digests.txt                      NAME REF@DIGEST, one line an image
#
#   images.sh           build into $OUT (bin/images)
#   images.sh --check   build everything twice, binaries included, into two
#                       scratch directories, and fail unless every digest
#                       is the same; then build into $OUT
#
# The environment: GO, VERSION, COMMIT, LDFLAGS (the Makefile's), TOOLS_DIR
# (the .debs are kept in $TOOLS_DIR/debs), SOURCE_DATE_EPOCH (default: the
# commit's time), IMAGES_UNPINNED_BUILD_HOST=1 to build on a host whose
# libc6-dev, libseccomp-dev or gcc are not the lock's. docs/release.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

GO=${GO:-go}
OUT=${OUT:-bin/images}
TOOLS_DIR=${TOOLS_DIR:-${HOME}/.cache/bulkhead/tools}
VERSION=${VERSION:?VERSION is unset (make images sets it)}
COMMIT=${COMMIT:?COMMIT is unset (make images sets it)}
LDFLAGS=${LDFLAGS:?LDFLAGS is unset (make images sets it)}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
export SOURCE_DATE_EPOCH
# The versions test/scripts/tools.sh pins for the node tools: runc for the
# runc tier, runsc of the gVisor version the shim links.
RUNC_VERSION=$(sed -n 's/^RUNC_VERSION=.*:-\(v[^}]*\)}/\1/p' test/scripts/tools.sh)
GVISOR_VERSION=$("$GO" list -m -f '{{.Version}}' gvisor.dev/gvisor)
GO_RELEASE=$("$GO" env GOVERSION)
[[ -n "$RUNC_VERSION" ]] || { echo "images: no RUNC_VERSION in test/scripts/tools.sh" >&2; exit 1; }

# binaries DIR: every binary the images carry, into DIR. -trimpath and the
# module cache make them independent of where the checkout and cache are.
binaries() {
	local dir=$1 # absolute: GOBIN must be
	mkdir -p "$dir"
	echo "images: building the binaries with $GO_RELEASE into $dir"
	# Static: the webhook, and the shims containerd runs on the host.
	CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$LDFLAGS" -o "$dir/" \
		./cmd/bulkhead-webhook ./cmd/containerd-shim-bulkhead-v1 ./cmd/containerd-shim-bulkhead-runc-v1
	# The agent loads NVML with dlopen: cgo, glibc from the base image; so
	# does the CLI beside it (bulkhead mig discover).
	CGO_ENABLED=1 "$GO" build -trimpath -ldflags "$LDFLAGS" -o "$dir/" ./cmd/bulkhead-agent ./cmd/bulkhead
	# runsc, static (it runs inside its own chroot), stamped with its version.
	(cd / && GOWORK=off GOBIN="$dir" CGO_ENABLED=0 "$GO" install -trimpath \
		-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION" "gvisor.dev/gvisor/runsc@$GVISOR_VERSION")
	# runc with seccomp, static as runc's own releases are: libseccomp and
	# glibc linked in, nothing needed of the host.
	(cd / && GOWORK=off GOBIN="$dir" CGO_ENABLED=1 "$GO" install -trimpath -tags "seccomp netgo osusergo" \
		-ldflags "-extldflags -static" "github.com/opencontainers/runc@$RUNC_VERSION")
}

# images BIN OUT: the images of the binaries in BIN, into OUT.
images() {
	"$GO" run ./deploy/image/build -bin "$1" -out "$2" -debs "$TOOLS_DIR/debs" \
		-version "$VERSION" -revision "$COMMIT" -go "$GO_RELEASE" \
		-check-build-host="$([[ "${IMAGES_UNPINNED_BUILD_HOST:-}" == 1 ]] && echo false || echo true)"
}

echo "images: $VERSION commit $COMMIT, SOURCE_DATE_EPOCH $SOURCE_DATE_EPOCH ($(date -u -d "@$SOURCE_DATE_EPOCH" +%FT%TZ)), runc $RUNC_VERSION, gVisor $GVISOR_VERSION"
if [[ "${1:-}" == --check ]]; then
	scratch=$(mktemp -d)
	trap 'rm -rf "$scratch"' EXIT
	for n in 1 2; do
		binaries "$scratch/bin$n"
		images "$scratch/bin$n" "$scratch/out$n"
	done
	if ! diff "$scratch/out1/digests.txt" "$scratch/out2/digests.txt"; then
		echo "images: NOT reproducible: the two builds above differ" >&2
		exit 1
	fi
	for f in "$scratch"/out1/*.oci.tar; do
		cmp "$f" "$scratch/out2/$(basename "$f")" || { echo "images: $(basename "$f") differs byte for byte" >&2; exit 1; }
	done
	echo "images: reproducible: two builds, binaries included, gave the same digests and archives"
	mkdir -p "$OUT"
	cp "$scratch"/out1/* "$OUT/"
	cat "$OUT/digests.txt"
	exit 0
fi
binaries "$PWD/bin/images/bin"
images "$PWD/bin/images/bin" "$OUT"
