#!/usr/bin/env bash
# The lease model: what a claim costs when it writes one lease row per
# batch instead of updating each message's row, against the floor model's
# row-by-row claim, in one serial cycle (claim 50, ack 50) on one topic.
#
#   bench/lease-model/run.sh [ROUNDS] [MESSAGES]     (defaults: 5 50000)
#
# Each round loads MESSAGES fresh messages per variant and runs the three
# variants one after the other, the order rotating each round, with pgbench
# (one client, prepared statements): row (row.sql, the floor model's claim
# and ack), lease (claim.sql, a lease row per claim, then ack-delete.sql,
# which deletes the range) and append (claim.sql, then ack-append.sql,
# which only records the range). It
# prints, per variant, the cycle's time and the machine's CPU per message,
# each round and their medians. A model, not the product: see
# bench/JOURNAL.md for what it leaves out.
# `go run ./lease-model/pipeline` in bench/ runs the lease model as a pool
# does, for jobs/s.
#
# Environment:
#   DSN   the database (default postgres:///hostbench?host=/var/run/postgresql&user=root);
#         the model makes and drops the schema lease_model there
set -euo pipefail

ROUNDS=${1:-5}
N=${2:-50000}
DSN=${DSN:-postgres:///hostbench?host=/var/run/postgresql&user=root}
here=$(cd "$(dirname "$0")" && pwd)
variants=(row lease append)
scripts=$(mktemp -d)
trap 'rm -rf "$scripts"' EXIT
cp "$here/row.sql" "$scripts/row.sql"
cat "$here/claim.sql" "$here/ack-delete.sql" > "$scripts/lease.sql"
cat "$here/claim.sql" "$here/ack-append.sql" > "$scripts/append.sql"

busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
hz=$(getconf CLK_TCK)
declare -A times cpus
for r in $(seq 1 "$ROUNDS"); do
	for k in 0 1 2; do
		v=${variants[$(( (k + r) % 3 ))]}
		psql "$DSN" -qX -v ON_ERROR_STOP=1 -v n="$N" -f "$here/schema.sql" >/dev/null
		psql "$DSN" -qX -c "VACUUM ANALYZE lease_model.q" -c "VACUUM ANALYZE lease_model.q2" -c CHECKPOINT >/dev/null
		b0=$(busy)
		out=$(pgbench "$DSN" -n -M prepared -f "$scripts/$v.sql" -t $(( N / 50 )) 2>&1) || { printf '%s\n' "$out" >&2; exit 1; }
		b1=$(busy)
		lat=$(printf '%s\n' "$out" | awk '/latency average/ { print $4 }')
		t=$(awk -v l="$lat" 'BEGIN { printf "%.2f", l * 1000 / 50 }')
		c=$(awk -v b=$(( b1 - b0 )) -v hz="$hz" -v n="$N" 'BEGIN { printf "%.2f", b / hz / n * 1e6 }')
		times[$v]+="$t "
		cpus[$v]+="$c "
		echo "round $r  $v  cycle $lat ms for 50: $t us a message, machine CPU $c us a message"
	done
done
psql "$DSN" -qX -c "SET client_min_messages = warning" -c "DROP SCHEMA lease_model CASCADE" >/dev/null
med() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
for v in "${variants[@]}"; do
	echo "median $v: $(echo "${times[$v]}" | med) us a message, machine CPU $(echo "${cpus[$v]}" | med) us a message"
done
