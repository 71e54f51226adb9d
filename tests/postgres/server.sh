#!/usr/bin/env bash
# The PostgreSQL server the PostgreSQL suites run on, on loopback.
#
#   tests/postgres/server.sh start   starts the machine's cluster (installing PostgreSQL with
#                                    apt when it is missing), creates a throwaway role and
#                                    database, and prints their URL on stdout
#   tests/postgres/server.sh stop    drops them, and stops the cluster if `start` started it
#
# Run as root (CI, these machines): the cluster tools and `runuser -u postgres` need it.
set -euo pipefail
cd "$(dirname "$0")/../.."
state="target/postgres-server"
name="agent_kernel_test"
mkdir -p "$state"

as_postgres() { (cd / && runuser -u postgres -- "$@"); }
psql_admin() { as_postgres psql -X -q -v ON_ERROR_STOP=1 -p "$(cat "$state/port")" "$@"; }

case "${1:-start}" in
start)
    if ! command -v pg_lsclusters >/dev/null; then
        echo "--- installing PostgreSQL" >&2
        apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2
    fi
    cluster="$(pg_lsclusters --no-header | sort -k1,1nr | head -1)"
    if [[ -z "$cluster" ]]; then
        version="$(ls /usr/lib/postgresql | sort -n | tail -1)"
        pg_createcluster "$version" main >&2
        cluster="$(pg_lsclusters --no-header | sort -k1,1nr | head -1)"
    fi
    read -r version cluster_name port status _ <<<"$cluster"
    echo "$port" > "$state/port"
    if [[ "$status" != online* ]]; then
        pg_ctlcluster "$version" "$cluster_name" start >&2
        echo "$version $cluster_name" > "$state/started"
    else
        rm -f "$state/started"
    fi
    password="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
    psql_admin <<SQL >&2
SET client_min_messages TO warning;
DROP DATABASE IF EXISTS $name;
DROP ROLE IF EXISTS $name;
CREATE ROLE $name LOGIN PASSWORD '$password';
CREATE DATABASE $name OWNER $name;
SQL
    echo "postgres://$name:$password@127.0.0.1:$port/$name"
    ;;
stop)
    if [[ -f "$state/port" ]]; then
        psql_admin -c "DROP DATABASE IF EXISTS $name WITH (FORCE)" -c "DROP ROLE IF EXISTS $name" >&2 || true
    fi
    if [[ -f "$state/started" ]]; then
        read -r version cluster_name < "$state/started"
        pg_ctlcluster "$version" "$cluster_name" stop >&2
        rm -f "$state/started"
    fi
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
