#!/usr/bin/env bash
# The per-task cost of a task run in a provider plugin (Go and Python)
# against an in-process task: a burn-down of N no-op tasks through each.
#
#   bench/providers.sh [N] [ROUNDS]        (defaults: 50000 3)
#
# It builds (make build, and the test plugin pytasks of the Python SDK,
# sdk/python/testdata/pytasks.py, packed with mkplugin.py), starts bin/host
# with tasks_worker on the memory broker (so that the store weighs
# nothing), the Go example plugin and pytasks. Then, ROUNDS times, for
# each kind in turn: it pauses the topic "default", submits N tasks as
# NDJSON (`bin/host tasks submit -file -`), resumes the topic and times
# until nothing is queued or running (looking every 20 ms). It prints each
# burn-down, the median in tasks/s and its ratio to in-process:
#
#   in-process  demo.echo        (tasks_worker's built-in task)
#   go          example.noop     (the Go example plugin)
#   python      pytasks.noop     (returns None)
#
# Environment:
#   WORKERS="8 64"          tasks_worker's workers: one sweep per value,
#                           each with a host of its own (default 8)
#   KINDS="go"              the kinds to run besides in-process (default
#                           go python)
#   CPU=1                   also print, for each burn-down, the CPU time
#                           (user + system, from /proc/<pid>/stat) each
#                           process spent per task: the host, tasks_worker
#                           and the provider; less sensitive to a busy
#                           machine than tasks/s
#   LISTEN=127.0.0.1:18091  the host's address
#   KEEP=1                  keep the temporary directory (config, host log)
set -euo pipefail

N=${1:-50000}
ROUNDS=${2:-3}
WORKERS=${WORKERS:-8}
read -r -a EXTRA <<<"${KINDS:-go python}"
LISTEN=${LISTEN:-127.0.0.1:18091}
PYTHON=${PYTHON:-/usr/bin/python3}

cd "$(dirname "$0")/.."
ROOT=$PWD
TMP=$(mktemp -d /tmp/taskhost-bench-providers.XXXXXX)
HOST_PID=
stop_host() {
	if [ -n "$HOST_PID" ] && kill -0 "$HOST_PID" 2>/dev/null; then
		kill -TERM "$HOST_PID" 2>/dev/null || true
		wait "$HOST_PID" 2>/dev/null || true
	fi
	HOST_PID=
}
cleanup() {
	stop_host
	if [ "${KEEP:-0}" = 1 ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

echo "building (make build, pytasks) ..." >&2
make -s build >/dev/null
mkdir -p "$TMP/plugins"
cp bin/plugins/fp-plugin-tasks_worker bin/plugins/fp-plugin-example "$TMP/plugins/"
"$PYTHON" sdk/python/mkplugin.py sdk/python/testdata/pytasks.py -o "$TMP/plugins/fp-plugin-pytasks" >/dev/null

HOSTCLI=("$ROOT/bin/host")
ADDR=(-addr "http://$LISTEN")
now() { date +%s.%N; }
queued_or_running() {
	"${HOSTCLI[@]}" topics list "${ADDR[@]}" | awk '$1 == "default" {print $2 + $3; found = 1} END {if (!found) print 0}'
}
drain() { while [ "$(queued_or_running)" != 0 ]; do sleep 0.02; done; }

declare -A LINE=(
	[in-process]='{"task":"demo.echo"}'
	[go]='{"task":"example.noop"}'
	[python]='{"task":"pytasks.noop"}'
)
KINDS=(in-process "${EXTRA[@]}")
for kind in "${KINDS[@]}"; do
	[ -n "${LINE[$kind]:-}" ] || { echo "unknown kind $kind (in-process, go, python)" >&2; exit 2; }
done

# start_host runs the host with tasks_worker's workers set to $1, and
# waits until one task of each kind is accepted and done (a provider's
# tasks are registered within a refresh, 5 s, of its start; a warm-up too).
start_host() {
	cat >"$TMP/taskhost.yaml" <<YAML
listen: $LISTEN
plugins_dir: $TMP/plugins
plugins:
  tasks_worker:
    enabled: true
    config:
      broker: memory
      workers: $1
  example:
    enabled: true
  pytasks:
    enabled: true
YAML
	"$ROOT/bin/host" -config "$TMP/taskhost.yaml" >"$TMP/host-$1.log" 2>&1 &
	HOST_PID=$!
	for _ in $(seq 1 600); do
		if "${HOSTCLI[@]}" topics list "${ADDR[@]}" -timeout 2s >/dev/null 2>&1; then break; fi
		if ! kill -0 "$HOST_PID" 2>/dev/null; then echo "the host exited; its log:" >&2; cat "$TMP/host-$1.log" >&2; exit 1; fi
		sleep 0.1
	done
	for kind in "${KINDS[@]}"; do
		local ok=0
		for _ in $(seq 1 600); do
			if echo "${LINE[$kind]}" | "${HOSTCLI[@]}" tasks submit -file - "${ADDR[@]}" >/dev/null 2>&1; then ok=1; break; fi
			sleep 0.1
		done
		[ "$ok" = 1 ] || { echo "the $kind task was never accepted; the host's log:" >&2; tail -20 "$TMP/host-$1.log" >&2; exit 1; }
	done
	drain
}

# cpu_ticks prints "name ticks" for the host and each of its plugins
# (named by the binary they run), user + system time in clock ticks.
cpu_ticks() {
	local pid exe
	awk '{ print "host", $14 + $15 }' "/proc/$HOST_PID/stat"
	for pid in $(ps -o pid= --ppid "$HOST_PID"); do
		exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
		case "$exe" in
		*fp-plugin-*) awk -v n="${exe##*fp-plugin-}" '{ print n, $14 + $15 }' "/proc/$pid/stat" ;;
		esac
	done
}
# cpu_per_task prints each process's CPU time per task in µs between two
# cpu_ticks outputs ($1, $2) over $3 tasks, for the processes that used any.
cpu_per_task() {
	awk -v n="$3" -v hz="$(getconf CLK_TCK)" '
		NR == FNR { before[$1] = $2; next }
		{ d = $2 - before[$1]; if (d > 0) { printf "%s %.1f  ", $1, d / hz * 1e6 / n; all += d } }
		END { printf "all %.1f µs/task", all / hz * 1e6 / n }' <(echo "$1") <(echo "$2")
}

median() { printf "%s\n" "$@" | sort -n | awk '{ v[NR] = $1 } END { printf "%.0f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "load before: $(cat /proc/loadavg)"
declare -A MEDIAN
for workers in $WORKERS; do
	start_host "$workers"
	declare -A RATES=()
	for round in $(seq 1 "$ROUNDS"); do
		for kind in "${KINDS[@]}"; do
			"${HOSTCLI[@]}" topics pause default "${ADDR[@]}" >/dev/null
			awk -v n="$N" -v l="${LINE[$kind]}" 'BEGIN { for (i = 0; i < n; i++) print l }' |
				"${HOSTCLI[@]}" tasks submit -file - "${ADDR[@]}" >/dev/null 2>&1
			[ "${CPU:-0}" = 1 ] && C0=$(cpu_ticks)
			T0=$(now)
			"${HOSTCLI[@]}" topics resume default "${ADDR[@]}" >/dev/null
			drain
			T1=$(now)
			[ "${CPU:-0}" = 1 ] && C1=$(cpu_ticks)
			rate=$(awk -v n="$N" -v a="$T0" -v b="$T1" 'BEGIN { printf "%.0f", n / (b - a) }')
			RATES[$kind]="${RATES[$kind]:-} $rate"
			printf "workers %-3d round %d  %-10s  %6d tasks in %6.2f s  %6d tasks/s\n" "$workers" "$round" "$kind" "$N" "$(awk -v a="$T0" -v b="$T1" 'BEGIN { print b - a }')" "$rate"
			if [ "${CPU:-0}" = 1 ]; then echo "    cpu per task, µs: $(cpu_per_task "$C0" "$C1" "$N")"; fi
		done
	done
	if grep -q "plugin failed\|panic" "$TMP/host-$workers.log"; then
		echo "the host log has failures; see it with KEEP=1" >&2
	fi
	stop_host
	for kind in "${KINDS[@]}"; do
		# shellcheck disable=SC2086
		MEDIAN[$workers,$kind]=$(median ${RATES[$kind]})
		MEDIAN[$workers,$kind,rounds]="${RATES[$kind]# }"
	done
done
echo "load after: $(cat /proc/loadavg)"

echo "medians of $ROUNDS burn-downs of $N no-op tasks, memory broker:"
for workers in $WORKERS; do
	base=${MEDIAN[$workers,in-process]}
	for kind in "${KINDS[@]}"; do
		med=${MEDIAN[$workers,$kind]}
		printf "  workers %-3d %-10s  %6d tasks/s  %5.2fx in-process   (rounds: %s)\n" "$workers" "$kind" "$med" \
			"$(awk -v a="$med" -v b="$base" 'BEGIN { printf "%.2f", a / b }')" "${MEDIAN[$workers,$kind,rounds]}"
	done
done
