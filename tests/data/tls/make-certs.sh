#!/usr/bin/env bash
# Regenerates the test PKI in this directory: a CA, a server certificate for
# 127.0.0.1 / localhost (the tests' servers listen on loopback) and a client
# certificate for mutual TLS, valid for 100 years so that the committed PEMs
# never expire under the tests. Run by hand; the tests read the PEMs.
set -euo pipefail
cd "$(dirname "$0")"
days=36500
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
  -subj "/CN=hetps test CA" -keyout ca.key -out ca.pem \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign"

# issue NAME CN EXTENDED_KEY_USAGE [SAN]
issue() {
  local name=$1 cn=$2 eku=$3 san=${4:-}
  openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$cn" \
    -keyout "$name.key" -out "$tmp/$name.csr"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    if [[ -n $san ]]; then echo "subjectAltName=$san"; fi
  } >"$tmp/$name.ext"
  openssl x509 -req -sha256 -days "$days" -in "$tmp/$name.csr" \
    -CA ca.pem -CAkey ca.key -CAcreateserial -extfile "$tmp/$name.ext" \
    -out "$name.pem"
}

issue server "hetps server" serverAuth "IP:127.0.0.1,DNS:localhost"
issue client "hetps client" clientAuth
# The CA key is only needed to sign the two above.
rm -f ca.srl ca.key
