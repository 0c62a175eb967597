#!/bin/sh
# Builds and signs the policy bundle for `kubectl apply -k deploy/`:
#   deploy/policy/build.sh TENANTS.json SIGNING_KEY.pem
# TENANTS.json holds {"bulkhead": {"tenants": {...}}} (see
# rego/examples/tenants.demo.json); SIGNING_KEY.pem is an RSA private key.
# Writes bundle.tar.gz (rego/ with the tenants in data.json, revision
# $REVISION or a UTC timestamp, signed with key
# id "bulkhead" for scope "bulkhead", as config.toml and the webhook expect)
# and bundle.pem (the public key) next to this script. Needs opa (`make
# tools`), jq and openssl.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 TENANTS.json SIGNING_KEY.pem" >&2; exit 2; }
tenants=$1 key=$2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
key_id=${KEY_ID:-bulkhead}
scope=${SCOPE:-bulkhead}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir "$work/bundle"
# The Rego modules without their tests, and the tenants merged into data.json.
for f in "$repo"/rego/*.rego; do
	case "$f" in *_test.rego) ;; *) cp "$f" "$work/bundle/" ;; esac
done
revision=${REVISION:-bulkhead-$(date -u +%Y%m%dT%H%M%SZ)}
jq --arg r "$revision" '.revision = $r' "$repo/rego/.manifest" >"$work/bundle/.manifest"
jq --slurpfile t "$tenants" '.bulkhead.tenants = $t[0].bulkhead.tenants' \
	"$repo/rego/data.json" >"$work/bundle/data.json"
printf '{"scope": "%s"}\n' "$scope" >"$work/claims.json"
"${OPA:-opa}" build --bundle "$work/bundle" \
	--signing-key "$key" --signing-alg RS256 \
	--verification-key-id "$key_id" --claims-file "$work/claims.json" \
	--output "$here/bundle.tar.gz"
openssl pkey -in "$key" -pubout -out "$here/bundle.pem"
echo "wrote $here/bundle.tar.gz (revision $revision, key id $key_id, scope $scope) and $here/bundle.pem"
