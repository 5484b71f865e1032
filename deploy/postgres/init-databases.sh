#!/bin/sh
# Run by the postgres image on its first start only (an empty data volume), as the
# POSTGRES_USER superuser: each service's database, owned by a role of its own, and
# the database's read-only role, exactly as scripts/infra-up makes them natively (the
# same service-database.psql; the roles and databases of scripts/lib.sh). Passwords
# come from the container's environment, PG_PASSWORD_<ROLE>.
set -eu

for pair in order_service:orders payment_service:payments \
  notification_service:notifications payment_provider:provider; do
  role=${pair%%:*}
  database=${pair#*:}
  reader=${database}_reader
  password=$(printenv "PG_PASSWORD_$(echo "$role" | tr '[:lower:]' '[:upper:]')")
  reader_password=$(printenv "PG_PASSWORD_$(echo "$reader" | tr '[:lower:]' '[:upper:]')")
  psql -X -q -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v role="$role" -v password="$password" -v database="$database" \
    -v reader="$reader" -v reader_password="$reader_password" \
    -f /docker-entrypoint-initdb.d/service-database.psql
done
