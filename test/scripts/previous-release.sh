#!/usr/bin/env bash
# Builds the previous release's node binaries for the upgrade test
# (test/e2e/upgrade_test.go) and prints the directory that holds them, laid
# out as that release's own ./bin:
#
#   <dir>/containerd-shim-bulkhead-v1
#   <dir>/containerd-shim-bulkhead-runc-v1
#   <dir>/mockgpu/bulkhead-agent      (tag bulkhead_mockgpu: the e2e nodes' GPUs are mock ones)
#   <dir>/mockgpu/bulkhead            (the CLI that reads that release's node state)
#
# The release is the commit in test/e2e/testdata/previous-release (the one
# place that names it); PREVIOUS_RELEASE=<commit> overrides it. Its tree is
# taken with `git archive` and built by that commit's own Makefile
# (`make build`), so its Go toolchain (GOTOOLCHAIN in that Makefile, not
# ours), tags, ldflags and cgo settings are the ones it shipped with;
# VERSION and COMMIT are passed in, since an archive has no .git to
# describe. The result is cached under
# ${TOOLS_DIR:-~/.cache/bulkhead/tools}/prev/<commit>/bin, keyed by the
# commit: a warm run prints the directory and builds nothing.
#
# Exit status 3, saying what to do, when the commit is missing from a
# shallow clone (the upgrade test then skips, naming it: .ci/run fetches the
# full history first); 1 when a full clone lacks it (a wrong commit) or the
# build fails, which fails the test.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
record="${root}/test/e2e/testdata/previous-release"
commit=${PREVIOUS_RELEASE:-$(grep -v '^#' "${record}" | tr -d '[:space:]')}
from=${PREVIOUS_RELEASE:+PREVIOUS_RELEASE}
if [[ ! "${commit}" =~ ^[0-9a-f]{40}$ ]]; then
	echo "previous-release: \"${commit}\" (from ${from:-${record}}) is not a full 40-hex commit id" >&2
	exit 1
fi
if ! git -C "${root}" cat-file -e "${commit}^{commit}" 2>/dev/null; then
	if [[ "$(git -C "${root}" rev-parse --is-shallow-repository 2>/dev/null)" == true ]]; then
		# A missing prerequisite, as a missing kernel feature is: the test
		# skips, naming it. .ci/run fetches the full history first.
		echo "previous-release: commit ${commit}, the previous release the upgrade test starts from, is not in this shallow clone: fetch full history (git fetch --unshallow, or git fetch origin ${commit}) and run again" >&2
		exit 3
	fi
	echo "previous-release: commit ${commit}, the previous release the upgrade test starts from, is not in this repository's history: ${from:-${record}} names a wrong commit" >&2
	exit 1
fi

TOOLS_DIR=${TOOLS_DIR:-${HOME}/.cache/bulkhead/tools}
out="${TOOLS_DIR}/prev/${commit}"
bins=(containerd-shim-bulkhead-v1 containerd-shim-bulkhead-runc-v1 mockgpu/bulkhead-agent mockgpu/bulkhead)
# cached prints the cache entry and exits when it is complete.
cached() {
	[[ -f "${out}/.complete" ]] || return 0
	for b in "${bins[@]}"; do
		[[ -x "${out}/bin/${b}" ]] || return 0
	done
	echo "previous-release: ${commit} (cached)" >&2
	echo "${out}/bin"
	exit 0
}
cached

# One build at a time per commit (two test binaries may ask at once); the
# second finds the first's result.
mkdir -p "${TOOLS_DIR}/prev"
exec 9>"${TOOLS_DIR}/prev/.${commit}.lock"
flock 9
cached

version=$(git -C "${root}" describe --tags --always "${commit}")
echo "previous-release: building ${version} (${commit}) with its own Makefile into ${out}" >&2
start=${SECONDS}
# A scratch directory beside the cache entry, renamed into place once the
# build is complete: an interrupted build leaves no half entry behind. Its
# path is fixed, so that a rebuild finds its packages in the Go build cache
# (which keys them by their directory).
tmp="${TOOLS_DIR}/prev/.build-${commit}"
rm -rf "${tmp}"
trap 'rm -rf "${tmp}"' EXIT
mkdir -p "${tmp}/src" "${tmp}/bin/mockgpu"
git -C "${root}" archive --format=tar "${commit}" | tar -x -C "${tmp}/src"
# GOTOOLCHAIN is left to that Makefile (`GOTOOLCHAIN ?=`): ours may name a
# newer Go. GO, when set, is the go command to start from.
env -u GOTOOLCHAIN make -C "${tmp}/src" --no-print-directory ${GO:+GO="${GO}"} \
	VERSION="${version}" COMMIT="${commit}" BIN="${tmp}/src/bin" build >&2
for b in "${bins[@]}"; do
	cp "${tmp}/src/bin/${b}" "${tmp}/bin/${b}"
done
rm -rf "${tmp}/src"
touch "${tmp}/.complete"
rm -rf "${out}"
mv "${tmp}" "${out}"
trap - EXIT
echo "previous-release: ${version} built in $((SECONDS - start))s" >&2
echo "${out}/bin"
