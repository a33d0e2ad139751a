#!/usr/bin/env bash
# Starts a 3-member etcd and 3 metropolisd curator instances on loopback
# ports, for a local trial of the scale-out mode (README: "Run a 3-node
# cluster on one machine"). Stops everything on Ctrl-C (or, with --smoke,
# after a quick check of forwarding and failover).
#
# Needs: etcd (Debian package etcd-server) and protoc (protobuf-compiler)
# to build the daemon with the `etcd` feature.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/three-node-cluster.sh [--dir DIR] [--daemon PATH] [--metroctl PATH]
                                     [--lease-ttl SECONDS] [--base-port PORT] [--smoke]

  --dir DIR          where etcd and the curators keep their data and logs
                     (default: ./metropolis-3node; reused if it exists)
  --daemon PATH      a metropolisd built with the etcd feature (default: build
                     it with `cargo build --release --features etcd`)
  --metroctl PATH    the metroctl to use (default: built alongside)
  --lease-ttl S      the curators' leader lease TTL (default: 5, the daemon's)
  --base-port PORT   first of the ports used (default: 17800): etcd members on
                     PORT+0..5, curators on PORT+10.. (TLS, agents)
  --smoke            check the cluster (calls through followers, failover after
                     killing the leader), then stop everything and exit
EOF
}

dir=./metropolis-3node
daemon=
metroctl=
lease_ttl=5
base=17800
smoke=0
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) dir=$2; shift 2 ;;
        --daemon) daemon=$2; shift 2 ;;
        --metroctl) metroctl=$2; shift 2 ;;
        --lease-ttl) lease_ttl=$2; shift 2 ;;
        --base-port) base=$2; shift 2 ;;
        --smoke) smoke=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

command -v etcd >/dev/null || { echo "etcd not found: apt-get install etcd-server" >&2; exit 1; }
if [ -z "$daemon" ]; then
    command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }
    echo "building metropolisd and metroctl with etcd support..."
    cargo build --release -q -p metropolisd --features etcd -p metroctl
    daemon=target/release/metropolisd
    metroctl=${metroctl:-target/release/metroctl}
fi
metroctl=${metroctl:-$(dirname "$daemon")/metroctl}
[ -x "$daemon" ] || { echo "$daemon: not an executable" >&2; exit 1; }
[ -x "$metroctl" ] || { echo "$metroctl: not an executable" >&2; exit 1; }

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
pids=()
stop() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop EXIT

# etcd: three members.
cluster=
for i in 0 1 2; do
    cluster+="${cluster:+,}e$i=http://127.0.0.1:$((base + 2 * i + 1))"
done
urls=
for i in 0 1 2; do
    client=http://127.0.0.1:$((base + 2 * i))
    urls+="${urls:+,}$client"
    etcd --name "e$i" --data-dir "$dir/etcd-$i" \
        --listen-client-urls "$client" --advertise-client-urls "$client" \
        --listen-peer-urls "http://127.0.0.1:$((base + 2 * i + 1))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((base + 2 * i + 1))" \
        --initial-cluster "$cluster" --initial-cluster-token metropolis-3node \
        >"$dir/etcd-$i.log" 2>&1 &
    pids+=($!)
done
echo "etcd: $urls (logs in $dir/etcd-*.log)"

# Curators: the first creates the cluster CA, the others join with a bundle
# of it (docs/operations.md, Adding a curator instance).
addr() { echo "127.0.0.1:$((base + 10 + 10 * $1))"; }
start_curator() {
    local i=$1
    "$daemon" --data-dir "$dir/curator-$i" --listen "$(addr "$i")" \
        --agent-listen "127.0.0.1:$((base + 11 + 10 * i))" \
        --etcd "$urls" --lease-ttl "$lease_ttl" "${@:2}" >>"$dir/curator-$i.log" 2>&1 &
    curator_pids[$i]=$!
    pids+=($!)
}
wait_for() {
    local what=$1 i
    shift
    for i in $(seq 1 150); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    echo "timed out waiting for $what" >&2
    return 1
}
declare -a curator_pids
start_curator 0
wait_for "curator-0" "$metroctl" --data-dir "$dir/curator-0" node list
# Kept for a rerun on the same directory; on real hosts, delete a bundle
# once the instance joined (it holds the CA key).
[ -f "$dir/join-bundle/ca.pem" ] ||
    "$metroctl" --data-dir "$dir/curator-0" node add --curator --out "$dir/join-bundle" >/dev/null
for i in 1 2; do
    start_curator "$i" --join "$dir/join-bundle"
done
for i in 0 1 2; do
    wait_for "curator-$i" "$metroctl" --data-dir "$dir/curator-$i" node list
done

ctl() { "$metroctl" --data-dir "$dir/curator-$1" "${@:2}"; }
leader() {
    # The instance whose last role change made it leader.
    local i
    for i in 0 1 2; do
        if [ -e "/proc/${curator_pids[$i]}" ] &&
            grep "curator role changed" "$dir/curator-$i.log" | tail -1 | grep "changed: leader" >/dev/null; then
            echo "$i"
            return 0
        fi
    done
    return 1
}
wait_for "a leader" leader
l=$(leader)

cat <<EOF

Three curators over one etcd; curator-$l leads, the others forward to it.
  curator-0: $(addr 0)   curator-1: $(addr 1)   curator-2: $(addr 2)
  logs: $dir/curator-*.log
Try (any instance answers):
  $metroctl --data-dir $dir/curator-1 node list
  $metroctl --data-dir $dir/curator-2 status set --external-address 192.0.2.2
  $metroctl --data-dir $dir/curator-0 watch nodes
  kill ${curator_pids[$l]}   # the leader: another takes over within the lease TTL ($lease_ttl s)
EOF

if [ "$smoke" = 1 ]; then
    followers=()
    for i in 0 1 2; do [ "$i" != "$l" ] && followers+=("$i"); done
    f1=${followers[0]}
    f2=${followers[1]}
    ctl "$f2" status set --external-address 192.0.2.2
    # (Not `| grep -q`: under pipefail, grep quitting early fails the pipe.)
    ctl "$f1" node list >"$dir/smoke.out"
    grep -qw "192.0.2.2" "$dir/smoke.out" || { echo "smoke: update through curator-$f2 not seen through curator-$f1" >&2; exit 1; }
    echo "smoke: calls through followers reach the leader"
    kill -9 "${curator_pids[$l]}"
    killed=$(date +%s%N)
    wait_for "an update after the leader was killed" ctl "$f1" status set --external-address 192.0.2.3
    took_ms=$((($(date +%s%N) - killed) / 1000000))
    took=$((took_ms / 1000)).$(printf %03d $((took_ms % 1000)))
    ctl "$f2" node list >"$dir/smoke.out"
    grep -qw "192.0.2.3" "$dir/smoke.out" || { echo "smoke: the update after failover not seen" >&2; exit 1; }
    echo "smoke: curator-$l killed; served again after ${took}s (lease TTL ${lease_ttl}s)"
    exit 0
fi

echo
echo "Ctrl-C stops everything."
wait
