#!/usr/bin/env bash
# Installs the Debian packages a local node needs (CNI plugins, busybox-static
# for the images, iproute2, and libseccomp-dev with pkg-config to build runc
# with seccomp), skipping what is already installed.
set -euo pipefail
PACKAGES=(containernetworking-plugins busybox-static iproute2 libseccomp-dev pkg-config)
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
