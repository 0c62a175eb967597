#!/usr/bin/env bash
# Installs Kueue's manager (sigs.k8s.io/kueue cmd/kueue), built from source
# with the pinned Go, into TOOLS_DIR/bin/kueue, and the manifests
# test/cluster needs to run it against a test cluster (its CRDs and its
# webhook configurations, config/components/crd/bases and
# config/components/webhook/manifests.yaml of the same module) into
# TOOLS_DIR/kueue/<version>/. Only `make bench-quota` uses it (the
# comparison of Bulkhead's quota ledger with Kueue): it is not part of
# `make tools` or CI.
#
# Keyed by its version in a stamp file like tools.sh, so a rerun with a warm
# cache costs nothing. The module is fetched through the Go module proxy
# (`go mod download`), like every other tool here; the build runs in a
# neutral directory so that our go.mod does not take part.
set -euo pipefail

GO=${GO:-go}
TOOLS_DIR=${TOOLS_DIR:-${HOME}/.cache/bulkhead/tools}
KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
GOBIN="${TOOLS_DIR}/bin"
SHARE="${TOOLS_DIR}/kueue/${KUEUE_VERSION}"
stamp="${TOOLS_DIR}/.kueue.version"
mkdir -p "${GOBIN}"

if [[ -x "${GOBIN}/kueue" && -f "${SHARE}/webhook/manifests.yaml" && -f "${stamp}" && "$(cat "${stamp}")" == "${KUEUE_VERSION}" ]]; then
	echo "kueue: ${KUEUE_VERSION} (cached) in ${GOBIN}/kueue, manifests in ${SHARE}"
	exit 0
fi

echo "kueue: building sigs.k8s.io/kueue/cmd/kueue ${KUEUE_VERSION} from source (go install; minutes, silent until done)"
start=${SECONDS}
mod_dir=$(cd / && GOWORK=off GOFLAGS=-mod=mod "${GO}" mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [[ -z "${mod_dir}" || ! -d "${mod_dir}" ]]; then
	echo "kueue: go mod download sigs.k8s.io/kueue@${KUEUE_VERSION} named no module directory" >&2
	exit 1
fi
# The version fields as Kueue's own Makefile sets them (LD_FLAGS): without
# them the manager logs v0.0.0-main. The module carries no commit id, so
# GitCommit stays empty rather than made up; BuildDate is the release's own
# date, so a rebuild is reproducible.
date=$(cd / && GOWORK=off GOFLAGS=-mod=mod "${GO}" list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' "sigs.k8s.io/kueue@${KUEUE_VERSION}")
ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION} -X sigs.k8s.io/kueue/pkg/version.GitCommit= -X sigs.k8s.io/kueue/pkg/version.BuildDate=${date}"
# Into a scratch directory first, so an interrupted build never leaves a
# binary beside a stamp of another version.
tmp="${TOOLS_DIR}/.kueue.tmp"
rm -rf "${tmp}"
mkdir -p "${tmp}"
(cd / && GOBIN="${tmp}" GOWORK=off CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath" \
	"${GO}" install -ldflags "${ldflags}" "sigs.k8s.io/kueue/cmd/kueue@${KUEUE_VERSION}")
rm -rf "${SHARE}"
mkdir -p "${SHARE}/crd" "${SHARE}/webhook"
cp "${mod_dir}"/config/components/crd/bases/*.yaml "${SHARE}/crd/"
cp "${mod_dir}/config/components/webhook/manifests.yaml" "${SHARE}/webhook/"
chmod -R u+w "${SHARE}"
mv "${tmp}/kueue" "${GOBIN}/kueue"
rmdir "${tmp}"
echo "${KUEUE_VERSION}" >"${stamp}"
took=$((SECONDS - start))
echo "kueue: ${KUEUE_VERSION} built in $((took / 60))m$((took % 60))s: ${GOBIN}/kueue, manifests in ${SHARE}"
