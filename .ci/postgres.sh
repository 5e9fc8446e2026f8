#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers on 127.0.0.1:5432 with trust auth for
# the user "postgres" and a database "test". Installs and starts one if needed.
set -euo pipefail
export PATH="$PATH:/usr/sbin"
ready() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }

if ! command -v pg_isready >/dev/null 2>&1 || ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  echo "ci: installing postgresql"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql
fi
if ! ready; then
  ver=$(ls /etc/postgresql | sort -V | tail -1)
  echo "ci: starting PostgreSQL $ver"
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  for _ in $(seq 1 30); do ready && break; sleep 1; done
fi
if ready; then
  psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" 2>/dev/null | grep -q 1 ||
    psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test" >/dev/null 2>&1 || true
  echo "ci: PostgreSQL ready"
else
  echo "ci: WARNING: PostgreSQL is not reachable on 127.0.0.1:5432; SQL guard tests will fail in CI"
fi
