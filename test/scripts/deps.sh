#!/usr/bin/env bash
# Installs the Debian packages a local node needs (CNI plugins, busybox-static
# for the images, iproute2, gcc for cgo (NVML in the agent and the CLI, runc's
# seccomp), and libseccomp-dev with pkg-config to build runc with seccomp),
# etcd-server for test/cluster's API server, and nftables, whose nft
# test/cluster's kube-proxy (nftables mode: tables of its own, which the
# test removes, never the host's iptables chains) programs, skipping what
# is already installed. etcd is Debian's 3.4 (the API server of v1.37 runs on
# it here) rather than built from go.etcd.io/etcd: a prebuilt,
# security-maintained package that installs in seconds, where a build adds
# minutes to a cold `make tools` on two cores for a store that only ever
# listens on loopback in a test.
set -euo pipefail
PACKAGES=(containernetworking-plugins busybox-static iproute2 gcc libc6-dev libseccomp-dev pkg-config etcd-server nftables)
missing=()
for p in "${PACKAGES[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
	echo "deps: ${PACKAGES[*]} (installed)"
	exit 0
fi
if [[ $(id -u) != 0 ]]; then
	echo "deps: missing ${missing[*]}; run as root (sudo make deps)" >&2
	exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
