#!/bin/sh
# Creates a CA and the webhook's serving certificate in deploy/tls/ for
# `kubectl apply -k deploy/`. The certificate names the Service
# bulkhead-webhook.bulkhead-system.svc, which the API server dials. The
# webhook serves it only with the certificate rotator off (--tls-cert and
# --tls-key instead of --cert-secret; docs/install.md, "Webhook
# certificates"); then put ca.crt in the caBundle yourself, and re-run this
# (and re-apply) to rotate: the webhook reloads the files the kubelet
# updates, without a restart. Needs openssl.
#
# It also creates a second CA, client-ca.crt, that only signs the API
# server's client certificate for the webhook (apiserver-client.{crt,key},
# subject CN bulkhead-apiserver-client): the webhook verifies it
# (--client-ca, --client-name) and the API server presents it through its
# AdmissionConfiguration (docs/install.md). Rotating the client CA needs a
# rollout of the webhook (it reads the CA at start).
set -eu
dir=${1:-$(dirname "$0")/tls}
days=${DAYS:-365}
svc=bulkhead-webhook.bulkhead-system.svc
mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.key" ]; then
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
		-keyout "$dir/ca.key" -out "$dir/ca.crt" -days 3650 \
		-subj "/CN=bulkhead-webhook-ca" 2>/dev/null
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
	-keyout "$dir/tls.key" -out "$dir/tls.csr" -subj "/CN=$svc" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local,DNS:bulkhead-webhook.bulkhead-system\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n' "$svc" "$svc" >"$dir/ext.cnf"
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
	-out "$dir/tls.crt" -days "$days" -extfile "$dir/ext.cnf" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/ext.cnf"
if [ ! -f "$dir/client-ca.key" ]; then
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
		-keyout "$dir/client-ca.key" -out "$dir/client-ca.crt" -days 3650 \
		-subj "/CN=bulkhead-webhook-client-ca" 2>/dev/null
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
	-keyout "$dir/apiserver-client.key" -out "$dir/apiserver-client.csr" -subj "/CN=bulkhead-apiserver-client" 2>/dev/null
printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n' >"$dir/ext.cnf"
openssl x509 -req -in "$dir/apiserver-client.csr" -CA "$dir/client-ca.crt" -CAkey "$dir/client-ca.key" -CAcreateserial \
	-out "$dir/apiserver-client.crt" -days "$days" -extfile "$dir/ext.cnf" 2>/dev/null
rm -f "$dir/apiserver-client.csr" "$dir/ext.cnf"
echo "wrote $dir/tls.crt, $dir/tls.key and $dir/ca.crt (CA key: $dir/ca.key)"
echo "wrote $dir/client-ca.crt (key: $dir/client-ca.key) and the API server's $dir/apiserver-client.{crt,key}"
