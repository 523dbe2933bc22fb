#!/bin/sh
# Make the Secrets the StatefulSet (statefulset.yaml) and a training job (training/) mount:
# a peer secret, a CA with one certificate per member and one for the job's workers, and the
# client tokens, then create them with kubectl. docs/deployment.md, "Deployment".
#
#     deploy/kubernetes/make-secrets.sh -n NAMESPACE -j JOB DIR
#
# DIR (created, private) keeps every file, the CA's key and the tokens included: keep it
# somewhere safe, or delete it once the Secrets exist. Nothing here is committed to the
# repository. Environment: KUBECTL (default kubectl); EXTRA_SANS, more subject alternative
# names for every member's certificate, comma-separated (e.g. DNS:rallypoint.example.com).
set -eu

usage() {
    echo "usage: $0 [-n NAMESPACE] [-j JOB] [-m MEMBERS] DIR" >&2
    exit 2
}

namespace=default
job=resnet
members=3
while getopts n:j:m: option; do
    case $option in
        n) namespace=$OPTARG ;;
        j) job=$OPTARG ;;
        m) members=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || usage
dir=$1
kubectl=${KUBECTL:-kubectl}
days=365

umask 077
mkdir -p "$dir"
cd "$dir"

# The peer secret every member holds: 256 random bits, as `rallypoint secret` makes them.
openssl rand -hex 32 > peer-secret

# A private CA that signs the members' and the clients' certificates.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=rallypoint-ca" -keyout ca.key -out ca.crt 2>/dev/null

# sign FILE NAME EXTENSIONS: FILE.key and FILE.crt (common name NAME), signed by the CA.
sign() {
    printf '%s\n' "$3" > "$1.ext"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}

# Member N (pod rallypoint-<N-1>): its peer identity, rallypoint-member-N, and every name
# peers and clients dial it by: its own DNS name under the headless Service, and the client
# Service's.
id=1
secret_files="--from-file=ca.crt"
while [ "$id" -le "$members" ]; do
    pod="rallypoint-$((id - 1))"
    names="DNS:rallypoint-member-$id"
    for host in "$pod.rallypoint" rallypoint-client; do
        names="$names,DNS:$host,DNS:$host.$namespace.svc,DNS:$host.$namespace.svc.cluster.local"
    done
    if [ -n "${EXTRA_SANS:-}" ]; then
        names="$names,$EXTRA_SANS"
    fi
    sign "member-$id" "rallypoint-member-$id" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$names"
    secret_files="$secret_files --from-file=member-$id.crt --from-file=member-$id.key"
    id=$((id + 1))
done

# The job's workers: a client certificate (never a member's name) and a token of role
# job:JOB. Operators get an admin token, dashboards a read token.
sign "job-$job" "rallypoint-job-$job" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
for who in admin read "job-$job"; do
    # No newline: the file is the token exactly as a client sends it (an environment
    # variable made from it must not end in one).
    openssl rand -hex 16 | tr -d '\n' > "$who.token"
done
digest() {
    openssl dgst -sha256 -r < "$1" | cut -d' ' -f1
}
cat > tokens.toml <<EOF
[[token]]
name = "operators"
role = "admin"
sha256 = "$(digest admin.token)"

[[token]]
name = "dashboards"
role = "read"
sha256 = "$(digest read.token)"

[[token]]
name = "$job workers"
role = "job:$job"
sha256 = "$(digest "job-$job.token")"
EOF

# The Secrets. The StatefulSet mounts the first three; training/ mounts the last.
# shellcheck disable=SC2086 # secret_files is a list of words
"$kubectl" -n "$namespace" create secret generic rallypoint-peer --from-file=peer-secret
"$kubectl" -n "$namespace" create secret generic rallypoint-tls $secret_files
"$kubectl" -n "$namespace" create secret generic rallypoint-tokens --from-file=tokens.toml
"$kubectl" -n "$namespace" create secret generic "rallypoint-job-$job" \
    --from-file=token="job-$job.token" --from-file=ca.crt \
    --from-file=tls.crt="job-$job.crt" --from-file=tls.key="job-$job.key"
echo "Secrets created in namespace $namespace; files (CA key, tokens) in $dir" >&2
