#!/bin/sh
# Random passwords for docker compose: MongoDB's root user, one user per service, MinIO's root and its agents' user,
# appended to .env (compose reads it) unless already there. Run once before the first `docker compose up`; keep .env private.
set -eu
env_file="${1:-.env}"
umask 077
touch "$env_file"
for name in ROOT SUBMITTER PLACEMENT MONITOR ESTIMATOR BILLING; do
  variable="TRAINMASTER_MONGO_${name}_PASSWORD"
  if ! grep -q "^${variable}=" "$env_file"; then
    # hex: safe inside a mongodb:// URL without escaping
    echo "${variable}=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')" >> "$env_file"
  fi
done
grep -q "^MINIO_ROOT_PASSWORD=" "$env_file" || echo "MINIO_ROOT_PASSWORD=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')" >> "$env_file"
grep -q "^TRAINMASTER_MINIO_AGENTS_PASSWORD=" "$env_file" ||
  echo "TRAINMASTER_MINIO_AGENTS_PASSWORD=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')" >> "$env_file"
echo "MongoDB and MinIO passwords in $env_file"
