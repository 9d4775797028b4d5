#!/usr/bin/env bash
# Measure brokers beside each other in one run: the bench command's
# phases (bulk submit, burn-down with reports, steady stream), one run of
# each broker per round, interleaved, then the medians per broker.
#
#   bench/brokers.sh [ROUNDS] [BROKER ...]   (defaults: 3 postgres rabbitmq)
#
# Environment:
#   JOBS=50000      messages per bulk submit and burn-down
#   DURATION=10s    the steady stream's length (at 500/s)
#   OUT=dir         where each run's output is kept (default a temporary directory)
#   BENCH="bin/host bench"
#                   the bench command (make build makes it)
# The rabbitmq broker needs RabbitMQ (127.0.0.1:5672, or TASKHOST_AMQP_URL);
# postgres and rabbitmq's state store need PostgreSQL (see bench -help).
set -euo pipefail

ROUNDS=${1:-3}
shift || true
BROKERS=("$@")
[ ${#BROKERS[@]} -gt 0 ] || BROKERS=(postgres rabbitmq)
JOBS=${JOBS:-50000}
DURATION=${DURATION:-10s}

cd "$(dirname "$0")/.."
BENCH=${BENCH:-bin/host bench}
OUT=${OUT:-$(mktemp -d /tmp/taskhost-bench-brokers.XXXXXX)}
mkdir -p "$OUT"
echo "runs kept in $OUT" >&2

for round in $(seq 1 "$ROUNDS"); do
	for b in "${BROKERS[@]}"; do
		echo "== round $round/$ROUNDS: $b" >&2
		# shellcheck disable=SC2086
		$BENCH -broker "$b" -runs 1 -jobs "$JOBS" -duration "$DURATION" >"$OUT/$b.$round.txt" 2>&1 || {
			echo "bench -broker $b failed; see $OUT/$b.$round.txt" >&2
			tail -5 "$OUT/$b.$round.txt" >&2
			exit 1
		}
		grep -E '^  (burn-down|steady) +[0-9]' "$OUT/$b.$round.txt" >&2 || true
	done
done

python3 - "$OUT" "$ROUNDS" "${BROKERS[@]}" <<'PY'
import json, statistics, sys
out, rounds, brokers = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
keys = [("burn_jobs_per_s", "burn-down jobs/s"), ("burn_wal_bytes_per_msg", "burn-down WAL B/msg"),
        ("steady_achieved_rate", "steady rate /s"), ("steady_p50_ms", "steady p50 ms"),
        ("steady_p99_ms", "steady p99 ms"), ("submit_jobs_per_s", "bulk submit jobs/s")]
rows = {}
for b in brokers:
    runs = []
    for r in range(1, rounds + 1):
        text = open(f"{out}/{b}.{r}.txt").read()
        js = text[text.rindex("== summary (JSON)"):].split("\n", 1)[1].strip().splitlines()[0]
        runs.append(json.loads(js))
    rows[b] = runs
print(f"== medians of {rounds} interleaved rounds")
print("  " + f"{'':24}" + "".join(f"{b:>36}" for b in brokers))
for k, label in keys:
    cells = []
    for b in brokers:
        vals = [r.get(k) for r in rows[b] if r.get(k) is not None]
        cells.append(f"{statistics.median(vals):,.1f} ({', '.join(f'{v:,.0f}' for v in vals)})" if vals else f"{'-':>22}")
    print(f"  {label:24}" + "".join(f"{c:>36}" for c in cells))
PY
