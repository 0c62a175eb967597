#!/bin/sh
# Bulkhead node installer, run by the bulkhead-node DaemonSet.
#
#   install.sh install     install the shim, runsc, config and policy on the
#                          host, register the runtime with containerd, then
#                          keep the config and policy in sync (default)
#   install.sh once        install and exit (tests, one-off jobs)
#   install.sh uninstall   remove the runtime from containerd and the files
#   install.sh remove      uninstall, then stay running (the DaemonSet's
#                          command during an uninstall, docs/install.md)
#
# Uninstall leaves REMOVED_MARKER on the host, which install removes: the
# agent container's readiness probe passes on it, so that the rollout of
# `remove` (whose agent waits for a config.toml that is gone) completes on
# one node and goes on to the next.
#
# Before it copies anything it checks that the host has what the host
# binaries need (HOST_NEEDS; all four are static in `make images`' image).
# The host's root file system is mounted at HOST_ROOT. Every host file is
# replaced by rename, so a running shim or containerd never reads half a
# file. containerd is restarted only when its configuration changed;
# restarting it leaves running pods alone (their shims keep running).
#
# The node agent (bulkhead-agent) is not copied to the host: containerd
# executes only the shims, so only they must be host files. The agent runs
# in the DaemonSet's agent container, from the image, on the host's paths
# (daemonset.yaml mounts them), and waits for the config.toml written here.
set -eu

HOST_ROOT=${HOST_ROOT:-/host}
BIN_SRC=${BIN_SRC:-/opt/bulkhead/bin}
CONFIG_SRC=${CONFIG_SRC:-/config/config.toml}
POLICY_SRC=${POLICY_SRC:-/policy}
# The public key that verifies the bundle, mounted from its own ConfigMap
# (bulkhead-policy-key), never from the bundle's.
POLICY_KEY_SRC=${POLICY_KEY_SRC:-/policy-key}
CONTAINERD_CONFIG=${CONTAINERD_CONFIG:-/etc/containerd/config.toml}
DROPIN=${DROPIN:-/etc/containerd/conf.d/bulkhead.toml}
# RESTART_CONTAINERD restarts the host's containerd; empty skips it.
RESTART_CONTAINERD=${RESTART_CONTAINERD-nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd}
# CONTAINERD_VERSION_CMD prints `containerd --version` of the host.
CONTAINERD_VERSION_CMD=${CONTAINERD_VERSION_CMD-nsenter --target 1 --mount -- containerd --version}
# HOST_NEEDS is what each host binary needs of the host, written by
# `make images` (deploy/image) next to the binaries: "NAME static", or
# "NAME needs LIBRARY [VERSION...]" for a dynamically linked one. It is
# checked before anything is copied.
HOST_NEEDS=${HOST_NEEDS:-$BIN_SRC/host-needs}
# Where the host's shared libraries are looked for, inside HOST_ROOT.
HOST_LIB_DIRS=${HOST_LIB_DIRS:-/usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /lib64 /usr/lib /lib}
SYNC_SECONDS=${SYNC_SECONDS:-30}
READY_FILE=${READY_FILE:-/tmp/bulkhead-ready}
# REMOVED_MARKER, a host path: Bulkhead was removed from this node.
REMOVED_MARKER=${REMOVED_MARKER:-/run/bulkhead/removed}
# GPU_NODE says whether this node is a GPU node, whose config.toml is
# CONFIG_SRC with GPU_CONFIG_SRC ([mig] backend = "nvml", [dra]) appended:
# "auto" where the NVIDIA driver is loaded (NVIDIA_DRIVER_PROC exists; the
# kernel's /proc/driver is the same in every container), "true", "false".
GPU_NODE=${GPU_NODE:-auto}
GPU_CONFIG_SRC=${GPU_CONFIG_SRC:-/config/gpu.toml}
NVIDIA_DRIVER_PROC=${NVIDIA_DRIVER_PROC:-/proc/driver/nvidia/version}

RUNTIME_NAME=bulkhead
RUNTIME_TYPE=io.containerd.bulkhead.v1
SHIM=containerd-shim-bulkhead-v1
# The runc tier: trusted pods on the host kernel, behind the same pipeline.
RUNC_RUNTIME_NAME=bulkhead-runc
RUNC_RUNTIME_TYPE=io.containerd.bulkhead-runc.v1
RUNC_SHIM=containerd-shim-bulkhead-runc-v1

log() { echo "bulkhead-node: $*" >&2; }
die() { log "error: $*"; exit 1; }

# put SRC DST MODE: copy SRC to the host path DST by rename if it differs.
# Prints "changed" when it wrote.
put() {
	src=$1 dst=$HOST_ROOT$2 mode=$3
	[ -f "$src" ] || die "$src: missing from the image or the mounted ConfigMap"
	if [ -f "$dst" ] && cmp -s "$src" "$dst"; then
		return 0
	fi
	mkdir -p "$(dirname "$dst")"
	tmp="$dst.bulkhead-tmp.$$"
	cp "$src" "$tmp"
	chmod "$mode" "$tmp"
	mv -f "$tmp" "$dst"
	log "wrote $2"
	echo changed
}

# write_text DST MODE: like put, for text read from standard input.
write_text() {
	tmp=$(mktemp)
	cat >"$tmp"
	out=$(put "$tmp" "$1" "$2")
	rm -f "$tmp"
	[ -z "$out" ] || echo "$out"
}

# config_version prints the version of the host's containerd config: the
# file's own `version =`, else 3 for containerd 2.x and 2 for 1.x.
config_version() {
	cfg=$HOST_ROOT$CONTAINERD_CONFIG
	if [ -f "$cfg" ]; then
		v=$(sed -n 's/^[[:space:]]*version[[:space:]]*=[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$cfg" | head -n 1)
		if [ -n "$v" ]; then
			echo "$v"
			return
		fi
		# containerd reads a file without a version as version 1, which it
		# migrates; our drop-in must then use version 2 names.
		echo 2
		return
	fi
	case "$(sh -c "$CONTAINERD_VERSION_CMD" 2>/dev/null || true)" in
	*" v1."* | *" 1."*) echo 2 ;;
	*) echo 3 ;;
	esac
}

# dropin VERSION prints the containerd drop-in for the config version.
dropin() {
	case "$1" in
	3) cri='plugins."io.containerd.cri.v1.runtime"' ;;
	2) cri='plugins."io.containerd.grpc.v1.cri"' ;;
	*) die "containerd config version $1 is not supported (2 or 3)" ;;
	esac
	cat <<EOF
# Written by Bulkhead's node installer; removed by \`install.sh uninstall\`.
version = $1

[$cri]
  # The shim's gVisor sandbox asks for oom_score_adj -998, below what
  # containerd may grant without CAP_SYS_RESOURCE; clamp instead of failing.
  restrict_oom_score_adj = true

[$cri.containerd.runtimes.$RUNTIME_NAME]
  runtime_type = "$RUNTIME_TYPE"
  runtime_path = "/usr/local/bin/$SHIM"
  # The shim reads the pod's requests (GPU profile, RDMA) from these.
  pod_annotations = ["bulkhead.dev/*"]

# The runc tier; the policy lets only the tiers it names use it.
[$cri.containerd.runtimes.$RUNC_RUNTIME_NAME]
  runtime_type = "$RUNC_RUNTIME_TYPE"
  runtime_path = "/usr/local/bin/$RUNC_SHIM"
  pod_annotations = ["bulkhead.dev/*"]
EOF
}

# ensure_import makes the main containerd config import the drop-in.
ensure_import() {
	cfg=$HOST_ROOT$CONTAINERD_CONFIG
	version=$1
	if [ ! -f "$cfg" ]; then
		printf 'version = %s\nimports = ["%s"]\n' "$version" "$DROPIN" | write_text "$CONTAINERD_CONFIG" 0644
		return
	fi
	if grep -q "\"$DROPIN\"" "$cfg"; then
		return
	fi
	tmp=$(mktemp)
	if grep -q '^[[:space:]]*imports[[:space:]]*=' "$cfg"; then
		# Add ours first in the existing list (one line or several).
		sed "0,/^\([[:space:]]*imports[[:space:]]*=[[:space:]]*\[\)[[:space:]]*\]/s//\1\"$(echo "$DROPIN" | sed 's/[\/&]/\\&/g')\"]/; t done
0,/^\([[:space:]]*imports[[:space:]]*=[[:space:]]*\[\)/s//\1\"$(echo "$DROPIN" | sed 's/[\/&]/\\&/g')\", /
: done" "$cfg" >"$tmp"
	else
		# imports is a top-level key: it must come before the first table.
		{ printf 'imports = ["%s"]\n' "$DROPIN"; cat "$cfg"; } >"$tmp"
	fi
	put "$tmp" "$CONTAINERD_CONFIG" 0644
	rm -f "$tmp"
}

# host_lib LIBRARY prints the path, under HOST_ROOT, of the host's file of
# a shared library, following its symlinks inside HOST_ROOT.
host_lib() {
	for d in $HOST_LIB_DIRS; do
		p=$HOST_ROOT$d/$1
		n=0
		while [ -L "$p" ] && [ "$n" -lt 16 ]; do
			t=$(readlink "$p")
			case $t in
			/*) p=$HOST_ROOT$t ;;
			*) p=$(dirname "$p")/$t ;;
			esac
			n=$((n + 1))
		done
		if [ -f "$p" ]; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

# check_host fails, naming everything missing, unless the host has every
# library and symbol version (GLIBC_2.34, ...) that HOST_NEEDS lists.
check_host() {
	if [ ! -f "$HOST_NEEDS" ]; then
		log "no $HOST_NEEDS: the host binaries' needs are not checked"
		return 0
	fi
	missing=
	dynamic=
	while read -r name kind lib versions; do
		case $name in '' | '#'*) continue ;; esac
		case $kind in
		static) continue ;;
		needs) dynamic="$dynamic $name" ;;
		*) die "$HOST_NEEDS: unknown line: $name $kind $lib" ;;
		esac
		if ! file=$(host_lib "$lib"); then
			missing="$missing
  $name needs $lib, which the host lacks (looked in $HOST_LIB_DIRS)"
			continue
		fi
		for v in $versions; do
			# Symbol versions are NUL-terminated strings of the library.
			if ! tr '\000' '\n' <"$file" | grep -qx "$v"; then
				missing="$missing
  $name needs $v of $lib; the host's ${file#"$HOST_ROOT"} lacks it (an older release)"
			fi
		done
	done <"$HOST_NEEDS"
	[ -z "$missing" ] || die "this host cannot run Bulkhead's host binaries; nothing was installed:$missing"
	if [ -n "$dynamic" ]; then
		log "host libraries checked for:$dynamic"
	fi
}

# gpu_node reports whether this node gets the GPU configuration.
gpu_node() {
	case $GPU_NODE in
	true) return 0 ;;
	false) return 1 ;;
	auto) [ -e "$NVIDIA_DRIVER_PROC" ] ;;
	*) die "GPU_NODE=$GPU_NODE: want auto, true or false" ;;
	esac
}

# node_config writes the node's config.toml into the file $1: CONFIG_SRC,
# with GPU_CONFIG_SRC appended on a GPU node.
node_config() {
	if ! gpu_node; then
		cp "$CONFIG_SRC" "$1"
		return 0
	fi
	[ -f "$GPU_CONFIG_SRC" ] || die "$GPU_CONFIG_SRC: missing from the mounted ConfigMap (GPU_NODE=$GPU_NODE)"
	{
		cat "$CONFIG_SRC"
		echo
		cat "$GPU_CONFIG_SRC"
	} >"$1"
}

sync_files() {
	config=$(mktemp)
	node_config "$config"
	put "$config" /etc/bulkhead/config.toml 0644
	rm -f "$config"
	put "$POLICY_SRC/bundle.tar.gz" /etc/bulkhead/bundle.tar.gz 0644
	put "$POLICY_KEY_SRC/bundle.pem" /etc/bulkhead/keys/bundle.pem 0644
}

install() {
	[ -d "$HOST_ROOT" ] || die "HOST_ROOT $HOST_ROOT: not a directory (mount the host's / there)"
	if gpu_node; then
		log "GPU node (GPU_NODE=$GPU_NODE): config.toml with $GPU_CONFIG_SRC appended"
	fi
	check_host
	put "$BIN_SRC/$SHIM" "/usr/local/bin/$SHIM" 0755 >/dev/null
	put "$BIN_SRC/runsc" /usr/local/bin/runsc 0755 >/dev/null
	put "$BIN_SRC/$RUNC_SHIM" "/usr/local/bin/$RUNC_SHIM" 0755 >/dev/null
	# Bulkhead's own runc build (config.toml runc_path), not the host's.
	put "$BIN_SRC/runc" /usr/local/bin/bulkhead-runc 0755 >/dev/null
	sync_files >/dev/null
	mkdir -p "$HOST_ROOT/run/bulkhead" "$HOST_ROOT/var/lib/bulkhead"
	rm -f "$HOST_ROOT$REMOVED_MARKER"

	version=$(config_version)
	changed=$(dropin "$version" | write_text "$DROPIN" 0644)
	changed=$changed$(ensure_import "$version")
	if [ -n "$changed" ]; then
		if [ -n "$RESTART_CONTAINERD" ]; then
			log "containerd config changed; restarting containerd"
			sh -c "$RESTART_CONTAINERD" || die "restarting containerd failed: $RESTART_CONTAINERD"
		else
			log "containerd config changed; restart skipped (RESTART_CONTAINERD is empty)"
		fi
	fi
	touch "$READY_FILE"
	log "runtimes $RUNTIME_NAME ($RUNTIME_TYPE) and $RUNC_RUNTIME_NAME ($RUNC_RUNTIME_TYPE) installed, containerd config version $version"
}

uninstall() {
	cfg=$HOST_ROOT$CONTAINERD_CONFIG
	changed=
	if [ -f "$HOST_ROOT$DROPIN" ]; then
		rm -f "$HOST_ROOT$DROPIN"
		changed=yes
	fi
	if [ -f "$cfg" ] && grep -q "\"$DROPIN\"" "$cfg"; then
		tmp=$(mktemp)
		esc=$(echo "$DROPIN" | sed 's/[\/&.]/\\&/g')
		sed -e "s/\"$esc\",[[:space:]]*//" -e "s/,[[:space:]]*\"$esc\"//" -e "s/\"$esc\"//" "$cfg" >"$tmp"
		put "$tmp" "$CONTAINERD_CONFIG" 0644 >/dev/null
		rm -f "$tmp"
		changed=yes
	fi
	rm -f "$HOST_ROOT/usr/local/bin/$SHIM" "$HOST_ROOT/usr/local/bin/runsc" \
		"$HOST_ROOT/usr/local/bin/$RUNC_SHIM" "$HOST_ROOT/usr/local/bin/bulkhead-runc"
	# Its files, then the directory itself, which a mount point (a node
	# whose /etc/bulkhead is mounted from elsewhere) keeps.
	rm -rf "$HOST_ROOT/etc/bulkhead" 2>/dev/null || [ -z "$(ls -A "$HOST_ROOT/etc/bulkhead")" ] ||
		die "$HOST_ROOT/etc/bulkhead: cannot remove"
	if [ -n "$changed" ] && [ -n "$RESTART_CONTAINERD" ]; then
		sh -c "$RESTART_CONTAINERD" || die "restarting containerd failed: $RESTART_CONTAINERD"
	fi
	mkdir -p "$(dirname "$HOST_ROOT$REMOVED_MARKER")"
	: >"$HOST_ROOT$REMOVED_MARKER"
	log "runtime $RUNTIME_NAME removed (ledger in /var/lib/bulkhead kept)"
}

case "${1:-install}" in
install)
	install
	# Keep the host's config and policy in step with the mounted ConfigMaps,
	# which the kubelet updates in place.
	while sleep "$SYNC_SECONDS"; do
		sync_files >/dev/null || log "sync failed; will retry"
	done
	;;
once) install ;;
uninstall) uninstall ;;
remove)
	uninstall
	touch "$READY_FILE"
	while sleep 3600; do :; done
	;;
*) die "unknown mode ${1}: install, once, uninstall or remove" ;;
esac
