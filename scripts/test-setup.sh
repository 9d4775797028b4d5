#!/usr/bin/env bash
# Makes sure what the test suite needs is there, installing or starting what
# is missing: PostgreSQL answering at $PGHOST:$PGPORT with a database "test",
# promtool and prometheus (metrics and alert-rule tests), Chromium (the UI
# test). Quick when everything is in place. `make test` and `make test/race`
# run it first; TASKHOST_TEST_SETUP=0 skips it.
#
# Installing needs root (apt-get); as another user it says what to install.
set -euo pipefail

PGHOST="${PGHOST:-127.0.0.1}"
PGPORT="${PGPORT:-5432}"

apt_updated=0
apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "test setup: missing $*; install it as root: apt-get install -y $*" >&2
    return 1
  fi
  if [ "$apt_updated" = 0 ]; then
    echo "test setup: apt-get update"
    apt-get update -qq
    apt_updated=1
  fi
  echo "test setup: installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# PostgreSQL: use the running server, start the packaged cluster, or run a
# private one in a temporary directory.
pg_up() { pg_isready -q -h "$PGHOST" -p "$PGPORT" 2>/dev/null; }
if ! command -v pg_isready >/dev/null; then apt_install postgresql; fi
if ! pg_up; then
  echo "test setup: PostgreSQL is not answering on $PGHOST:$PGPORT; starting it"
  if ls /etc/postgresql/*/main >/dev/null 2>&1; then
    ver=$(ls /etc/postgresql | sort -V | tail -1)
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  fi
fi
if ! pg_up; then
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  pgdata=$(mktemp -d /tmp/taskhost-pg.XXXXXX)
  chown postgres "$pgdata" 2>/dev/null || true
  run_pg() { if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else bash -c "$*"; fi; }
  echo "test setup: starting a private PostgreSQL cluster in $pgdata"
  run_pg "$bindir/initdb -D $pgdata -U postgres -A trust" >/dev/null
  run_pg "$bindir/pg_ctl -D $pgdata -o '-p $PGPORT -k /tmp -c listen_addresses=$PGHOST' -l $pgdata/log -w start"
fi
for _ in $(seq 1 30); do pg_up && break; sleep 1; done
pg_up || { echo "test setup: PostgreSQL did not come up on $PGHOST:$PGPORT" >&2; exit 1; }
psql -h "$PGHOST" -p "$PGPORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" | grep -q 1 \
  || psql -h "$PGHOST" -p "$PGPORT" -U postgres -c "CREATE DATABASE test" >/dev/null

# promtool checks the metrics exposition and the alert rules; Prometheus
# itself scrapes a running host in a test; Chromium drives the UI test.
command -v promtool >/dev/null || apt_install prometheus
command -v chromium >/dev/null || apt_install chromium
