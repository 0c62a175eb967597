#!/usr/bin/env bash
# Installs the pinned node toolchain (containerd, ctr, runsc, crictl, opa,
# runc), the upstream shims make bench-start compares Bulkhead's against
# (containerd-shim-runc-v2 and gVisor's containerd-shim-runsc-v1), and the
# Kubernetes components of test/cluster (kube-apiserver, kubelet,
# kube-scheduler, kube-controller-manager, kube-proxy, kubectl) and Helm
# (deploy/chart's lint and render tests) into TOOLS_DIR with `go install` /
# `go build`. Each step is keyed by its version in a stamp file, so a rerun
# with a warm cache costs nothing; a cold run builds every tool from source
# and says how far it is.
#
# Usage: tools.sh [node|bench|all]. "node" installs what a local node needs
# (make tools-node: the demo, the e2e tests, opa for building bundles);
# "bench" adds the upstream shims, which only the benchmarks use (make
# tools-bench); "all" (the default, make tools: make test and CI) adds
# Kubernetes for test/cluster, containerd-shim-runc-v2 (test/cluster's
# nodes run pods without a RuntimeClass, Bulkhead's webhook, on it, as a
# real node's containerd does) and Helm for deploy/chart to "node", not
# gVisor's shim, which no test needs (test/node registers the upstream
# shims only when they are installed).
set -euo pipefail

GO=${GO:-go}
TOOLS_SET=${1:-all}
case "${TOOLS_SET}" in
node | bench | all) ;;
*)
	echo "tools.sh: unknown set \"${TOOLS_SET}\" (want node, bench or all)" >&2
	exit 2
	;;
esac

TOOLS_DIR=${TOOLS_DIR:-${HOME}/.cache/bulkhead/tools}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
OPA_VERSION=${OPA_VERSION:-v1.22.4}
# runc for the bulkhead-runc handler: built with seccomp (cgo, Debian's
# libseccomp-dev), never Debian's older runc.
RUNC_VERSION=${RUNC_VERSION:-v1.5.3}
# Helm for deploy/chart (lint, template, package; make chart and make test).
HELM_VERSION=${HELM_VERSION:-v4.3.2}
# runsc must match the gVisor version of go.mod (the shim links the same library).
GVISOR_VERSION=${GVISOR_VERSION:-$(cd "$(dirname "$0")/../.." && "${GO}" list -m -f '{{.Version}}' gvisor.dev/gvisor)}

mkdir -p "${TOOLS_DIR}/bin"
export GOBIN="${TOOLS_DIR}/bin"
export GOFLAGS="${GOFLAGS:-} -trimpath"

TOOLS_TOTAL=5 # install_tool calls below, plus the upstream shims for "bench", plus helm and build_kube for "all"
if [[ "${TOOLS_SET}" == bench ]]; then TOOLS_TOTAL=7; fi
if [[ "${TOOLS_SET}" == all ]]; then TOOLS_TOTAL=8; fi
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
	if [[ $# -eq 1 && "$(basename "${1%@*}")" != "${name}" ]]; then
		# go install names a binary after its package's last path element
		# (gVisor's shim is gvisor.dev/gvisor/shim): install it into a
		# scratch directory and move it in under the name containerd looks up.
		local tmp="${TOOLS_DIR}/.${name}.tmp"
		rm -rf "${tmp}"
		mkdir -p "${tmp}"
		(cd / && GOBIN="${tmp}" GOWORK=off CGO_ENABLED=${cgo} "${GO}" install "$@")
		mv "${tmp}/$(basename "${1%@*}")" "${GOBIN}/${name}"
		rmdir "${tmp}"
	else
		(cd / && GOWORK=off CGO_ENABLED=${cgo} "${GO}" install "$@")
	fi
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
if [[ "${TOOLS_SET}" != node ]]; then
	# containerd's own runc shim, as upstream ships it: the baseline of the
	# runc tier's start times (make bench-start), and test/cluster's nodes'
	# default runtime.
	install_tool containerd-shim-runc-v2 "${CONTAINERD_VERSION}" 1 \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@${CONTAINERD_VERSION}"
fi
if [[ "${TOOLS_SET}" == bench ]]; then
	# gVisor's own shim of the same gVisor version as runsc and Bulkhead's
	# shim library, as upstream ships it (static like runsc): the baseline of
	# the gVisor tier's start times where the shim may set its oom_score_adj
	# (CAP_SYS_RESOURCE; docs/benchmarks.md).
	install_tool containerd-shim-runsc-v1 "${GVISOR_VERSION}" 0 "gvisor.dev/gvisor/shim@${GVISOR_VERSION}"
fi
if [[ "${TOOLS_SET}" == all ]]; then
	# The version is stamped as Helm's own release build stamps it (its
	# Makefile's LDFLAGS); without it `helm version` says "v4.3".
	install_tool helm "${HELM_VERSION}" 0 \
		-ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=${HELM_VERSION}" \
		"helm.sh/helm/v4/cmd/helm@${HELM_VERSION}"
fi

# Kubernetes of one release, built from the k8s.io/kubernetes module through
# the tools module test/cluster/tools (its go.mod says why it exists). The
# five commands build in one `go build`, so the packages they share compile
# once. The version fields are set as upstream's release build sets them:
# without them every binary reports v0.0.0-master and version-skew checks
# (kubelet vs API server, kubectl's warning) misfire. buildDate is the
# release's own date on the module proxy, so a rebuild is reproducible;
# gitTreeState "archive" is what upstream writes for a build from a source
# archive, which the module is (it carries no commit id, so gitCommit stays
# empty rather than made up).
KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
build_kube() {
	tool_n=$((tool_n + 1))
	local mod_dir
	mod_dir="$(cd "$(dirname "$0")/../cluster/tools" && pwd)"
	local have
	have=$(cd "${mod_dir}" && GOWORK=off "${GO}" list -m -f '{{.Version}}' k8s.io/kubernetes)
	if [[ "${have}" != "${KUBE_VERSION}" ]]; then
		echo "tools: KUBE_VERSION=${KUBE_VERSION} but ${mod_dir}/go.mod requires k8s.io/kubernetes ${have}: change both (and the staging replaces) together" >&2
		exit 1
	fi
	# The stamp covers the module's go.sum too: a changed dependency rebuilds.
	local version
	version="${KUBE_VERSION}+$(sha256sum "${mod_dir}/go.sum" | cut -c1-12)"
	local stamp="${TOOLS_DIR}/.kubernetes.version"
	local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
	local missing=0 c
	for c in "${cmds[@]}"; do [[ -x "${GOBIN}/${c}" ]] || missing=1; done
	if ((missing == 0)) && [[ -f "${stamp}" && "$(cat "${stamp}")" == "${version}" ]]; then
		echo "tools: ${tool_n}/${TOOLS_TOTAL} kubernetes ${KUBE_VERSION} (${cmds[*]}) (cached)"
		return
	fi
	echo "tools: ${tool_n}/${TOOLS_TOTAL} building kubernetes ${KUBE_VERSION} (${cmds[*]}) from source (go build; ~15 minutes on two idle cores, ~45 on busy ones; silent until done)"
	local start=${SECONDS}
	local minor=${KUBE_VERSION#v1.}
	minor=${minor%%.*}
	local date
	date=$(cd "${mod_dir}" && GOWORK=off "${GO}" list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
	local ldflags="" pkg
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
		ldflags+=" -X ${pkg}.gitTreeState=archive -X ${pkg}.buildDate=${date}"
	done
	local pkgs=()
	for c in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${c}"); done
	# Into a scratch directory first, so an interrupted build never leaves a
	# half set beside a stamp.
	rm -rf "${TOOLS_DIR}/.kubernetes.tmp"
	mkdir -p "${TOOLS_DIR}/.kubernetes.tmp"
	(cd "${mod_dir}" && GOWORK=off CGO_ENABLED=0 "${GO}" build -ldflags "-s -w${ldflags}" -o "${TOOLS_DIR}/.kubernetes.tmp/" "${pkgs[@]}")
	for c in "${cmds[@]}"; do mv "${TOOLS_DIR}/.kubernetes.tmp/${c}" "${GOBIN}/${c}"; done
	rmdir "${TOOLS_DIR}/.kubernetes.tmp"
	echo "${version}" >"${stamp}"
	local took=$((SECONDS - start))
	echo "tools: ${tool_n}/${TOOLS_TOTAL} kubernetes ${KUBE_VERSION} built in $((took / 60))m$((took % 60))s"
}
if [[ "${TOOLS_SET}" == all ]]; then build_kube; fi

echo "tools: installed in ${GOBIN}"
