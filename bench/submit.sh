#!/usr/bin/env bash
# Submit N no-op tasks to a real host as NDJSON, then burn them down.
#
#   bench/submit.sh [local|postgres] [N]        (defaults: local 1000000)
#
# It builds (make build), starts bin/host with tasks_worker alone on the
# broker, pauses the topic "default", streams N lines of
# {"task":"demo.echo"} (the built-in task that returns its payload) to
# `bin/host tasks submit -file -`, resumes the topic and waits until
# nothing is queued or running. It prints the submit rate, the burn-down
# time, the total, and the peak RSS (VmHWM) of the host and of the
# tasks_worker process.
#
# Environment:
#   WORKERS=8               tasks_worker's workers
#   LISTEN=127.0.0.1:18089  the host's address
#   TASKHOST_TEST_DSN       postgres: the database to use (its public schema
#                           gets the broker's tables); without it a database
#                           taskhost_bench_<pid> is created on
#                           postgres@127.0.0.1:5432 and dropped at the end
#   KEEP=1                  keep the temporary directory (config, host log)
set -euo pipefail

BROKER=${1:-local}
N=${2:-1000000}
WORKERS=${WORKERS:-8}
LISTEN=${LISTEN:-127.0.0.1:18089}
case "$BROKER" in local|postgres) ;; *) echo "usage: $0 [local|postgres] [N]" >&2; exit 2 ;; esac

cd "$(dirname "$0")/.."
ROOT=$PWD
TMP=$(mktemp -d /tmp/taskhost-bench-submit.XXXXXX)
HOST_PID=
DROP_DB=
cleanup() {
	if [ -n "$HOST_PID" ] && kill -0 "$HOST_PID" 2>/dev/null; then
		kill -TERM "$HOST_PID" 2>/dev/null || true
		wait "$HOST_PID" 2>/dev/null || true
	fi
	if [ -n "$DROP_DB" ]; then
		psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $DROP_DB WITH (FORCE)" >/dev/null || true
	fi
	if [ "${KEEP:-0}" = 1 ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

echo "building (make build) ..." >&2
make -s build >/dev/null

BROKER_CONFIG="broker: local
      data_dir: $TMP/var"
if [ "$BROKER" = postgres ]; then
	DSN=${TASKHOST_TEST_DSN:-}
	if [ -z "$DSN" ]; then
		DROP_DB=taskhost_bench_$$
		if ! psql -q -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE $DROP_DB" >/dev/null; then
			DROP_DB=
			echo "cannot create a database on postgres@127.0.0.1:5432: start PostgreSQL (pg_ctlcluster 15 main start) or set TASKHOST_TEST_DSN" >&2
			exit 1
		fi
		DSN="postgres://postgres@127.0.0.1:5432/$DROP_DB?sslmode=disable"
	fi
	BROKER_CONFIG="broker: postgres
      dsn: \"$DSN\""
fi

# max_body_bytes: a host that buffers request bodies (one that does not
# stream NDJSON to the plugin) needs the whole upload under it; 63 MiB is
# the most it takes, about 3,000,000 lines of this task.
cat >"$TMP/taskhost.yaml" <<YAML
listen: $LISTEN
plugins_dir: $ROOT/bin/plugins
max_body_bytes: 66060288
plugins:
  tasks_worker:
    enabled: true
    config:
      $BROKER_CONFIG
      workers: $WORKERS
YAML

HOSTCLI=("$ROOT/bin/host")
ADDR=(-addr "http://$LISTEN")
"$ROOT/bin/host" -config "$TMP/taskhost.yaml" >"$TMP/host.log" 2>&1 &
HOST_PID=$!
for _ in $(seq 1 600); do
	if "${HOSTCLI[@]}" topics list "${ADDR[@]}" -timeout 2s >/dev/null 2>&1; then break; fi
	if ! kill -0 "$HOST_PID" 2>/dev/null; then echo "the host exited; its log:" >&2; cat "$TMP/host.log" >&2; exit 1; fi
	sleep 0.1
done
"${HOSTCLI[@]}" topics list "${ADDR[@]}" >/dev/null || { echo "tasks_worker did not come up; host log: $TMP/host.log" >&2; KEEP=1; exit 1; }
WORKER_PID=$("${HOSTCLI[@]}" plugins "${ADDR[@]}" | awk '$1 == "tasks_worker" {print $4}')

now() { date +%s.%N; }
queued_or_running() {
	"${HOSTCLI[@]}" topics list "${ADDR[@]}" | awk '$1 == "default" {print $2 + $3; found = 1} END {if (!found) print 0}'
}

"${HOSTCLI[@]}" topics pause default "${ADDR[@]}" >/dev/null
echo "submitting $N tasks to the $BROKER broker (topic paused) ..." >&2
T0=$(now)
awk -v n="$N" 'BEGIN { for (i = 0; i < n; i++) print "{\"task\":\"demo.echo\"}" }' |
	"${HOSTCLI[@]}" tasks submit -file - "${ADDR[@]}"
T1=$(now)

echo "burning down with $WORKERS workers ..." >&2
"${HOSTCLI[@]}" topics resume default "${ADDR[@]}" >/dev/null
while [ "$(queued_or_running)" != 0 ]; do sleep 1; done
T2=$(now)

hwm() { awk '/^VmHWM/ {printf "%.0f MiB", $2 / 1024}' "/proc/$1/status" 2>/dev/null || echo "?"; }
HOST_HWM=$(hwm "$HOST_PID")
WORKER_HWM=$(hwm "$WORKER_PID")

awk -v n="$N" -v t0="$T0" -v t1="$T1" -v t2="$T2" -v b="$BROKER" -v w="$WORKERS" -v hh="$HOST_HWM" -v wh="$WORKER_HWM" 'BEGIN {
	printf "broker %s, %d tasks, %d workers\n", b, n, w
	printf "submit:    %.2f s, %.0f tasks/s\n", t1 - t0, n / (t1 - t0)
	printf "burn-down: %.2f s, %.0f tasks/s\n", t2 - t1, n / (t2 - t1)
	printf "total:     %.2f s\n", t2 - t0
	printf "peak RSS:  host %s, tasks_worker %s\n", hh, wh
}'
