#!/usr/bin/env bash
# Makes sure what the test suite needs is there, installing or starting what
# is missing: PostgreSQL answering at $PGHOST:$PGPORT with a database "test",
# RabbitMQ answering at 127.0.0.1:5672 (guest/guest), promtool and prometheus (metrics and alert-rule tests), Chromium (the UI
# test), ip, setpriv and the PostgreSQL server binaries (the chaos suite), Debian's Python 3 with python3-grpcio, python3-protobuf and
# python3-cryptography (the Python SDK's tests). Quick when everything is in place. `make test` and `make test/race`
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

# PostgreSQL: the tests use TEST_DATABASE_URL (default: user postgres, no
# password, database test on 127.0.0.1:5432). When it answers, nothing is
# done. A database named by the caller is only checked. For the default,
# the packaged cluster is started (and installed when missing), or else a
# private one in a temporary directory; a cluster installed here is made
# to trust user postgres on 127.0.0.1, as the default address needs.
default_dsn="postgres://postgres@$PGHOST:$PGPORT/test?sslmode=disable"
dsn="${TEST_DATABASE_URL:-$default_dsn}"
db_ok() { psql "$dsn" -Atqc 'SELECT 1' >/dev/null 2>&1; }
pg_up() { pg_isready -q -h "$PGHOST" -p "$PGPORT" 2>/dev/null; }
tcp_ok() { psql -h "$PGHOST" -p "$PGPORT" -U postgres -d postgres -Atqc 'SELECT 1' >/dev/null 2>&1; }
as_postgres() { if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else bash -c "$*"; fi; }

if command -v psql >/dev/null && db_ok; then
  :
elif [ "$dsn" != "$default_dsn" ]; then
  echo "test setup: the database of TEST_DATABASE_URL does not answer (psql \"\$TEST_DATABASE_URL\" -c 'SELECT 1' fails); start it, or unset TEST_DATABASE_URL to use a local one" >&2
  exit 1
else
  installed=0
  if ! command -v pg_isready >/dev/null || ! command -v psql >/dev/null; then
    apt_install postgresql postgresql-client
    installed=1
  fi
  ver=""
  if ls /etc/postgresql/*/main >/dev/null 2>&1; then
    ver=$(ls /etc/postgresql | sort -V | tail -1)
  fi
  if ! pg_up && [ -n "$ver" ] && [ "$PGPORT" = 5432 ]; then
    echo "test setup: PostgreSQL is not answering on $PGHOST:$PGPORT; starting the packaged cluster $ver/main"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
    for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  fi
  if pg_up && ! tcp_ok && [ "$installed" = 1 ] && [ -n "$ver" ] && [ "$(id -u)" = 0 ]; then
    # Debian's cluster asks for a password on 127.0.0.1; the tests' default
    # address has none.
    hba=/etc/postgresql/$ver/main/pg_hba.conf
    echo "test setup: letting user postgres in without a password on 127.0.0.1 ($hba)"
    sed -i '1i host all postgres 127.0.0.1/32 trust\nhost all postgres ::1/128 trust' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
    sleep 1
  fi
  if ! pg_up; then
    bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
    pgdata=$(mktemp -d /tmp/taskhost-pg.XXXXXX)
    chown postgres "$pgdata" 2>/dev/null || true
    echo "test setup: starting a private PostgreSQL cluster in $pgdata"
    as_postgres "$bindir/initdb -D $pgdata -U postgres -A trust" >/dev/null
    as_postgres "$bindir/pg_ctl -D $pgdata -o '-p $PGPORT -k /tmp -c listen_addresses=$PGHOST' -l $pgdata/log -w start"
  fi
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  pg_up || { echo "test setup: PostgreSQL did not come up on $PGHOST:$PGPORT" >&2; exit 1; }
  if ! db_ok; then
    if tcp_ok; then
      psql -h "$PGHOST" -p "$PGPORT" -U postgres -d postgres -qc "CREATE DATABASE test" >/dev/null 2>&1 || true
    else
      as_postgres "psql -qc 'CREATE DATABASE test'" >/dev/null 2>&1 || true
    fi
  fi
  db_ok || {
    echo "test setup: PostgreSQL answers on $PGHOST:$PGPORT, but $default_dsn does not: let user postgres in without a password from 127.0.0.1 (pg_hba.conf: host all postgres 127.0.0.1/32 trust), or set TEST_DATABASE_URL" >&2
    exit 1
  }
fi

# RabbitMQ: the tests use TASKHOST_TEST_AMQP_URL (default
# amqp://guest:guest@127.0.0.1:5672/). When its port answers, nothing is
# done; a server named by the caller is only checked. For the default, the
# packaged server is started (and installed when missing) with its own
# defaults, whose guest user may connect from 127.0.0.1.
default_amqp_url="amqp://guest:guest@127.0.0.1:5672/"
amqp_url="${TASKHOST_TEST_AMQP_URL:-$default_amqp_url}"
amqp_hostport() {
  # host:port of an amqp:// URL (default port 5672).
  local rest="${1#*://}"
  rest="${rest##*@}"
  rest="${rest%%/*}"
  rest="${rest%%\?*}"
  case "$rest" in
  *:*) echo "$rest" ;;
  '') echo "127.0.0.1:5672" ;;
  *) echo "$rest:5672" ;;
  esac
}
amqp_addr=$(amqp_hostport "$amqp_url")
amqp_up() { timeout 2 bash -c "exec 3<>/dev/tcp/${amqp_addr%:*}/${amqp_addr##*:}" 2>/dev/null; }

if amqp_up; then
  :
elif [ "$amqp_url" != "$default_amqp_url" ]; then
  echo "test setup: the RabbitMQ server of TASKHOST_TEST_AMQP_URL does not answer at $amqp_addr; start it, or unset TASKHOST_TEST_AMQP_URL to use a local one" >&2
  exit 1
else
  if ! command -v rabbitmq-server >/dev/null; then
    apt_install rabbitmq-server
  fi
  if ! amqp_up; then
    echo "test setup: RabbitMQ is not answering on $amqp_addr; starting it (rabbitmq-server -detached)"
    rabbitmq-server -detached || true
    # A first start on a fresh machine creates its database: give it time.
    timeout 120 rabbitmqctl await_startup >/dev/null 2>&1 || true
    for _ in $(seq 1 120); do amqp_up && break; sleep 1; done
  fi
  amqp_up || {
    echo "test setup: RabbitMQ did not come up on $amqp_addr; see /var/log/rabbitmq/ and start it with: rabbitmq-server -detached" >&2
    exit 1
  }
fi

# promtool checks the metrics exposition and the alert rules; Prometheus
# itself scrapes a running host in a test; Chromium drives the UI test.
command -v promtool >/dev/null || apt_install prometheus
command -v chromium >/dev/null || apt_install chromium

# The chaos suite (make chaos, which CI runs) runs a PostgreSQL cluster of
# its own in a network namespace: it needs iproute2's ip, setpriv
# (util-linux) and the server binaries under /usr/lib/postgresql/*/bin.
# Without root this only names them: the rest of the suite does not need
# them, and make chaos names them again.
command -v ip >/dev/null || apt_install iproute2 || true
command -v setpriv >/dev/null || apt_install util-linux || true
ls /usr/lib/postgresql/*/bin/initdb /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || apt_install postgresql || true

# The Python SDK (sdk/python) uses Debian's interpreter and packages only,
# never the PATH's python3 (which may be another one).
if ! /usr/bin/python3 -c 'import grpc, google.protobuf, cryptography' >/dev/null 2>&1; then
  apt_install python3 python3-grpcio python3-protobuf python3-cryptography
fi
