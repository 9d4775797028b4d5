#!/usr/bin/env bash
# Real host processes sharing one PostgreSQL database.
#
#   bench/across-hosts.sh across   submit-to-outcome latency across two hosts
#   bench/across-hosts.sh idle     transactions/s that ten idle hosts cause
#
# across: host B's tasks_worker serves the topic "remote" (topics: in its
# config); host A's does not (workers: 1, its tasks' own topics only). A
# program (bench/cmd/acrosshosts, the Go client) submits demo.echo on topic
# "remote" through host A's API at RATE/s for DURATION, each submit at its own
# time on a fixed schedule. A accepts it because a live worker elsewhere runs
# demo.echo on that topic, so every task is claimed by host B. Latency is
# tw_messages_all.finished_at - created_at, both PostgreSQL's now(): from the start
# of the submit's transaction to the start of the ack's transaction (it leaves
# out the HTTP request around the submit and the ack's commit). It prints p50,
# p90, p99, max, the count and how many host B claimed, per run, then the
# medians of the runs.
#
# idle: ten hosts, each with tasks_worker alone, idle; after SETTLE seconds,
# xact_commit + xact_rollback of the database in pg_stat_database is read
# before and after each window of IDLE seconds.
#
# No setting turns the announcements off; BIN=DIR runs the binaries of
# another build in either mode, such as the one before announcements (its
# pools poll every 100 ms):
#   git worktree add --detach /tmp/taskhost-before 1ba2848^ && make -C /tmp/taskhost-before build
#   BIN=/tmp/taskhost-before/bin bench/across-hosts.sh idle
#
# Environment:
#   RUNS=3  RATE=500  DURATION=30s  HOSTS=10  SETTLE=10  IDLE=30
#   B_WORKERS=100           host B's workers (as bin/host bench -workers)
#   BIN=bin                 the directory with host and plugins/ (make build here
#                           builds ./bin)
#   PORT=18200              host i listens on 127.0.0.1:PORT+i
#   TASKHOST_TEST_DSN       the database to use (its public schema gets the
#                           broker's tables; idle counts every transaction on
#                           it); without it a database taskhost_across_<pid> is
#                           created on postgres@127.0.0.1:5432 and dropped at the end
#   KEEP=1                  keep the temporary directory (configs, host logs)
set -euo pipefail

MODE=${1:-}
case "$MODE" in across|idle) ;; *) echo "usage: $0 across|idle" >&2; exit 2 ;; esac
RUNS=${RUNS:-3}
RATE=${RATE:-500}
DURATION=${DURATION:-30s}
HOSTS=${HOSTS:-10}
SETTLE=${SETTLE:-10}
IDLE=${IDLE:-30}
PORT=${PORT:-18200}
B_WORKERS=${B_WORKERS:-100}

cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=$(cd "${BIN:-bin}" 2>/dev/null && pwd || true)
TMP=$(mktemp -d /tmp/taskhost-across.XXXXXX)
PIDS=()
DROP_DB=
cleanup() {
	for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	if [ -n "$DROP_DB" ]; then
		psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $DROP_DB WITH (FORCE)" >/dev/null || true
	fi
	if [ "${KEEP:-0}" = 1 ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

if [ -z "${BIN}" ] || [ "$BIN" = "$ROOT/bin" ]; then
	echo "building (make build) ..." >&2
	make -s build >/dev/null
	BIN=$ROOT/bin
fi
[ -x "$BIN/host" ] && [ -x "$BIN/plugins/fp-plugin-tasks_worker" ] || { echo "no $BIN/host or $BIN/plugins/fp-plugin-tasks_worker: run make build there" >&2; exit 1; }

DSN=${TASKHOST_TEST_DSN:-}
if [ -z "$DSN" ]; then
	DROP_DB=taskhost_across_$$
	if ! psql -q -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE $DROP_DB" >/dev/null; then
		DROP_DB=
		echo "cannot create a database on postgres@127.0.0.1:5432: start PostgreSQL (pg_ctlcluster 15 main start) or set TASKHOST_TEST_DSN" >&2
		exit 1
	fi
	DSN="postgres://postgres@127.0.0.1:5432/$DROP_DB?sslmode=disable"
fi
sql() { psql -XAtq -v ON_ERROR_STOP=1 "$DSN" -c "$1"; }

# start_host NAME PORT EXTRA: a host with tasks_worker alone on the database.
start_host() {
	local name=$1 port=$2 extra=${3:-}
	cat >"$TMP/$name.yaml" <<YAML
listen: 127.0.0.1:$port
plugins_dir: $BIN/plugins
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: postgres
      dsn: "$DSN"
$extra
YAML
	TASKHOST_LISTEN= "$BIN/host" -config "$TMP/$name.yaml" >"$TMP/$name.log" 2>&1 &
	PIDS+=($!)
}
# wait_up NAME PORT: until the host's tasks API answers.
wait_up() {
	local name=$1 port=$2
	for _ in $(seq 1 1200); do
		if curl -sf -o /dev/null "http://127.0.0.1:$port/plugin-pkg/tasks_worker/api/topics"; then return 0; fi
		sleep 0.1
	done
	echo "host $name did not come up; its log:" >&2
	cat "$TMP/$name.log" >&2
	exit 1
}
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

if [ "$MODE" = across ]; then
	(cd bench && go build -o "$TMP/acrosshosts" ./cmd/acrosshosts)
	start_host B $((PORT + 2)) "      workers: $B_WORKERS
      topics:
        remote: {}"
	wait_up B $((PORT + 2))
	start_host A $((PORT + 1)) "      workers: 1"
	wait_up A $((PORT + 1))
	B_ID=$(sql "SELECT id FROM tw_workers WHERE 'remote' = ANY(topics)")
	A_ID=$(sql "SELECT id FROM tw_workers WHERE NOT 'remote' = ANY(topics)")
	echo "host A: 127.0.0.1:$((PORT + 1)), worker $A_ID (does not claim topic remote)"
	echo "host B: 127.0.0.1:$((PORT + 2)), worker $B_ID (claims topic remote)"
	echo "latency = finished_at - created_at of tw_messages_all (PostgreSQL now(): submit's transaction start to ack's transaction start)"
	: >"$TMP/results"
	for run in $(seq 1 "$RUNS"); do
		FROM=$(sql "SELECT coalesce(max(id), 0) FROM tw_messages_all")
		"$TMP/acrosshosts" -addr "http://127.0.0.1:$((PORT + 1))" -topic remote -rate "$RATE" -duration "$DURATION"
		for _ in $(seq 1 1200); do
			[ "$(sql "SELECT count(*) FROM tw_messages WHERE id > $FROM AND finished_at IS NULL")" = 0 ] && break
			sleep 0.1
		done
		sql "SELECT count(*) FILTER (WHERE finished_at IS NULL) FROM tw_messages WHERE id > $FROM" | grep -qx 0 ||
			{ echo "run $run: tasks still unfinished after 120 s" >&2; KEEP=1; exit 1; }
		LINE=$(sql "SELECT round(p[1]::numeric, 1), round(p[2]::numeric, 1), round(p[3]::numeric, 1), round(mx::numeric, 1), n, byb, ndone
			FROM (SELECT percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY ms) AS p, max(ms) AS mx, count(*) AS n,
			             count(*) FILTER (WHERE claimed_by = '$B_ID') AS byb, count(*) FILTER (WHERE state = 'done') AS ndone
			      FROM (SELECT extract(epoch FROM finished_at - created_at) * 1000 AS ms, claimed_by, state
			            FROM tw_messages_all WHERE id > $FROM) m) s" | tr '|' ' ')
		read -r P50 P90 P99 MAX N BYB NDONE <<<"$LINE"
		echo "run $run: p50 $P50 ms, p90 $P90 ms, p99 $P99 ms, max $MAX ms; $N tasks, $NDONE done, $BYB claimed by host B"
		echo "$P50 $P90 $P99 $MAX" >>"$TMP/results"
		[ "$run" = "$RUNS" ] || sleep 5
	done
	printf "median of %s runs at %s/s for %s: p50 %s ms, p90 %s ms, p99 %s ms, max %s ms\n" "$RUNS" "$RATE" "$DURATION" \
		"$(awk '{print $1}' "$TMP/results" | median)" "$(awk '{print $2}' "$TMP/results" | median)" \
		"$(awk '{print $3}' "$TMP/results" | median)" "$(awk '{print $4}' "$TMP/results" | median)"
	exit 0
fi

# idle
for i in $(seq 1 "$HOSTS"); do
	start_host "h$i" $((PORT + i)) "      workers: 8"
done
for i in $(seq 1 "$HOSTS"); do
	wait_up "h$i" $((PORT + i))
done
DB=$(sql "SELECT current_database()")
echo "$HOSTS idle hosts ($BIN), $(sql "SELECT count(*) FROM tw_workers") workers registered; settling ${SETTLE} s"
sleep "$SETTLE"
xacts() { sql "SELECT pg_stat_clear_snapshot(); SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$DB'" | tail -n 1; }
: >"$TMP/results"
for run in $(seq 1 "$RUNS"); do
	X0=$(xacts)
	T0=$(date +%s.%N)
	sleep "$IDLE"
	X1=$(xacts)
	T1=$(date +%s.%N)
	RATE_X=$(awk -v a="$X0" -v b="$X1" -v t0="$T0" -v t1="$T1" 'BEGIN {printf "%.1f", (b - a) / (t1 - t0)}')
	echo "window $run: $((X1 - X0)) transactions in $(awk -v t0="$T0" -v t1="$T1" 'BEGIN {printf "%.1f", t1 - t0}') s: $RATE_X/s"
	echo "$RATE_X" >>"$TMP/results"
done
echo "median of $RUNS windows: $(median <"$TMP/results") transactions/s on database $DB (PostgreSQL's stats, flushed by each backend within about a second; the two reads add 2 or 4)"
