#!/usr/bin/env bash
# Compare two builds of the broker and the worker pool by alternating
# burn-downs.
#
#   bench/pairs.sh BASE TRIAL [PAIRS] [JOBS]     (defaults: 20 50000)
#
# BASE and TRIAL are bench binaries (make build writes bin/taskhost-bench;
# build the other from a worktree), or, for a build from before the bench
# had a binary of its own, that build's bin/plugins/fp-plugin-tasks_worker,
# which is run as `BIN bench`. Each pair runs `BIN -broker postgres -jobs
# JOBS -workers 100 -limit 100 -runs 1` once with each, the order flipping
# every pair so that neither
# build always runs second, and prints both burn-downs' jobs/s and the ratio
# TRIAL/BASE; then the median, smallest and largest ratio. On a shared
# machine one pair's ratio moves by a third either way: judge the median of
# many pairs, never one.
#
# Environment:
#   DSN   the database (default postgres:///hostbench?host=/var/run/postgresql&user=root&sslmode=disable,
#         over the Unix socket, as the side bench runs it: over TCP, each round trip
#         costs the process more); each run makes and drops a schema of its own there
set -euo pipefail

BASE=${1:?usage: $0 BASE TRIAL [PAIRS] [JOBS]}
TRIAL=${2:?usage: $0 BASE TRIAL [PAIRS] [JOBS]}
PAIRS=${3:-20}
JOBS=${4:-50000}
DSN=${DSN:-postgres:///hostbench?host=/var/run/postgresql&user=root&sslmode=disable}

# run BIN ARGS...: the bench binary BIN with ARGS (a plugin binary of an
# older build takes them after its bench subcommand).
run() {
	local bin=$1
	shift
	case "$(basename "$bin")" in
	fp-plugin-*) "$bin" bench "$@" ;;
	*) "$bin" "$@" ;;
	esac
}

one() {
	local out rate
	out=$(run "$1" -dsn "$DSN" -broker postgres -jobs "$JOBS" -workers 100 -limit 100 -runs 1 -duration 1s 2>&1) || {
		printf '%s\n' "$out" | tail -5 >&2
		echo "$1 failed" >&2
		return 1
	}
	rate=$(printf '%s\n' "$out" | awk '!found && /burn-down / {
		for (i = 1; i < NF; i++) if ($(i+1) == "jobs/s") { print $i; found = 1; break } }')
	if [ -z "$rate" ]; then
		echo "$1 printed no burn-down line" >&2
		return 1
	fi
	echo "$rate"
}

ratios=()
for i in $(seq 1 "$PAIRS"); do
	if (( i % 2 )); then b=$(one "$BASE"); t=$(one "$TRIAL"); else t=$(one "$TRIAL"); b=$(one "$BASE"); fi
	r=$(awk -v t="$t" -v b="$b" 'BEGIN { printf "%.3f", t / b }')
	ratios+=("$r")
	echo "pair $i  base $b  trial $t  ratio $r"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 }
	END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
		printf "median ratio %.3f over %d pairs (smallest %.3f, largest %.3f)\n", m, NR, a[1], a[NR] }'
