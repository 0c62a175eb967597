#!/usr/bin/env bash
# Installs the pinned node toolchain (containerd, ctr, runsc, crictl, opa) into
# TOOLS_DIR with `go install`. Each binary is keyed by its version in a stamp
# file, so a rerun with a warm cache costs nothing; a cold run builds five
# tools from source (about 20 minutes on two cores) and says how far it is.
set -euo pipefail

GO=${GO:-go}

TOOLS_DIR=${TOOLS_DIR:-${HOME}/.cache/bulkhead/tools}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
OPA_VERSION=${OPA_VERSION:-v1.22.4}
# runc for the bulkhead-runc handler: built with seccomp (cgo, Debian's
# libseccomp-dev), never Debian's older runc.
RUNC_VERSION=${RUNC_VERSION:-v1.5.3}
# runsc must match the gVisor version of go.mod (the shim links the same library).
GVISOR_VERSION=${GVISOR_VERSION:-$(cd "$(dirname "$0")/../.." && "${GO}" list -m -f '{{.Version}}' gvisor.dev/gvisor)}

mkdir -p "${TOOLS_DIR}/bin"
export GOBIN="${TOOLS_DIR}/bin"
export GOFLAGS="${GOFLAGS:-} -trimpath"

TOOLS_TOTAL=6 # install_tool calls below
tool_n=0
install_tool() { # name version cgo package...
	local name=$1 version=$2 cgo=$3
	shift 3
	tool_n=$((tool_n + 1))
	local stamp="${TOOLS_DIR}/.${name}.version"
	if [[ -x "${GOBIN}/${name}" && -f "${stamp}" && "$(cat "${stamp}")" == "${version}" ]]; then
		echo "tools: ${tool_n}/${TOOLS_TOTAL} ${name} ${version} (cached)"
		return
	fi
	echo "tools: ${tool_n}/${TOOLS_TOTAL} building ${name} ${version} from source (go install; minutes, silent until done)"
	local start=${SECONDS}
	# GOWORK=off and a neutral directory: go install pkg@version must not see our go.mod.
	(cd / && GOWORK=off CGO_ENABLED=${cgo} "${GO}" install "$@")
	echo "${version}" >"${stamp}"
	local took=$((SECONDS - start))
	echo "tools: ${tool_n}/${TOOLS_TOTAL} ${name} ${version} built in $((took / 60))m$((took % 60))s"
}

install_tool containerd "${CONTAINERD_VERSION}" 1 \
	"github.com/containerd/containerd/v2/cmd/containerd@${CONTAINERD_VERSION}" \
	"github.com/containerd/containerd/v2/cmd/ctr@${CONTAINERD_VERSION}"
# A dynamically linked runsc fails inside its own chroot: always static.
install_tool runsc "${GVISOR_VERSION}" 0 "gvisor.dev/gvisor/runsc@${GVISOR_VERSION}"
install_tool crictl "${CRICTL_VERSION}" 0 "sigs.k8s.io/cri-tools/cmd/crictl@${CRICTL_VERSION}"
install_tool opa "${OPA_VERSION}" 0 "github.com/open-policy-agent/opa@${OPA_VERSION}"
install_tool runc "${RUNC_VERSION}" 1 -tags seccomp "github.com/opencontainers/runc@${RUNC_VERSION}"
# containerd's own runc shim, as upstream ships it: the baseline of the runc
# tier's start times (make bench-start).
install_tool containerd-shim-runc-v2 "${CONTAINERD_VERSION}" 1 \
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@${CONTAINERD_VERSION}"

echo "tools: installed in ${GOBIN}"
