#!/usr/bin/env bash
# Installs the pinned node toolchain (containerd, ctr, runsc, crictl, opa) into
# TOOLS_DIR with `go install`. Each binary is keyed by its version in a stamp
# file, so a rerun with a warm cache costs nothing.
set -euo pipefail

TOOLS_DIR=${TOOLS_DIR:-${HOME}/.cache/bulkhead/tools}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
OPA_VERSION=${OPA_VERSION:-v1.22.4}
# runc for the bulkhead-runc handler: built with seccomp (cgo, Debian's
# libseccomp-dev), never Debian's older runc.
RUNC_VERSION=${RUNC_VERSION:-v1.5.3}
# runsc must match the gVisor version of go.mod (the shim links the same library).
GVISOR_VERSION=${GVISOR_VERSION:-$(cd "$(dirname "$0")/../.." && go list -m -f '{{.Version}}' gvisor.dev/gvisor)}

mkdir -p "${TOOLS_DIR}/bin"
export GOBIN="${TOOLS_DIR}/bin"
export GOFLAGS="${GOFLAGS:-} -trimpath"

install_tool() { # name version cgo package...
	local name=$1 version=$2 cgo=$3
	shift 3
	local stamp="${TOOLS_DIR}/.${name}.version"
	if [[ -x "${GOBIN}/${name}" && -f "${stamp}" && "$(cat "${stamp}")" == "${version}" ]]; then
		echo "tools: ${name} ${version} (cached)"
		return
	fi
	echo "tools: building ${name} ${version}"
	# GOWORK=off and a neutral directory: go install pkg@version must not see our go.mod.
	(cd / && GOWORK=off CGO_ENABLED=${cgo} go install "$@")
	echo "${version}" >"${stamp}"
}

install_tool containerd "${CONTAINERD_VERSION}" 1 \
	"github.com/containerd/containerd/v2/cmd/containerd@${CONTAINERD_VERSION}" \
	"github.com/containerd/containerd/v2/cmd/ctr@${CONTAINERD_VERSION}"
# A dynamically linked runsc fails inside its own chroot: always static.
install_tool runsc "${GVISOR_VERSION}" 0 "gvisor.dev/gvisor/runsc@${GVISOR_VERSION}"
install_tool crictl "${CRICTL_VERSION}" 0 "sigs.k8s.io/cri-tools/cmd/crictl@${CRICTL_VERSION}"
install_tool opa "${OPA_VERSION}" 0 "github.com/open-policy-agent/opa@${OPA_VERSION}"
install_tool runc "${RUNC_VERSION}" 1 -tags seccomp "github.com/opencontainers/runc@${RUNC_VERSION}"

echo "tools: installed in ${GOBIN}"
