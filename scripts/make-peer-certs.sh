#!/usr/bin/env bash
# Makes the certificates of polykvd's peer link (mutual TLS between daemons,
# used to move sessions: docs/operations.md, "Moving a session"):
#
#   scripts/make-peer-certs.sh DIR NAME [SAN...]
#
# DIR/ca.pem, DIR/ca.key: the CA, made once and reused by later calls;
# DIR/NAME.pem, DIR/NAME.key: a certificate for one daemon, for both ends of
# the link (serverAuth and clientAuth), naming each SAN (e.g.
# IP:10.0.0.7 DNS:node-7.example): a daemon moving a session checks that the
# target's certificate names the host it dials. Without SANs:
# IP:127.0.0.1 and DNS:localhost (two daemons on one machine, the tests).
# Keys are EC P-256, readable by their owner only; the CA's key should leave
# the machine that signs, in a real deployment.
set -euo pipefail

if [ $# -lt 2 ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  [ "${1:-}" = "--help" ] && exit 0
  exit 2
fi
dir=$1
name=$2
shift 2
sans=("$@")
if [ ${#sans[@]} -eq 0 ]; then sans=("IP:127.0.0.1" "DNS:localhost"); fi
command -v openssl >/dev/null || { echo "make-peer-certs: openssl is missing (scripts/install-deps.sh)" >&2; exit 1; }
case "$name" in
  ca|*/*|"") echo "make-peer-certs: NAME must be a plain name other than 'ca'" >&2; exit 2 ;;
esac

mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=polykv peer CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
fi
san=$(IFS=,; echo "${sans[*]}")
ext=$(mktemp)
trap 'rm -f "$ext" "$dir/$name.csr"' EXIT
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature\nbasicConstraints=CA:FALSE\n' \
  "$san" > "$ext"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
  -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -CAcreateserial -days 825 -extfile "$ext" -out "$dir/$name.pem" 2>/dev/null
echo "make-peer-certs: $dir/$name.pem ($san), signed by $dir/ca.pem"
