#!/usr/bin/env bash
# Installs the Debian packages the tests run for real, when they are
# missing: PostgreSQL 15 server and client (test/pgchart and the backup
# tests run the chart's configuration and pg_dump/pg_restore with them) and
# redis-server with redis-cli (the passthrough backup test runs the Redis
# backup command of watches.yaml against it); what the real nodes need
# (below). `make tools` runs it, so the
# README's test command sets them up on a fresh machine by itself.
set -euo pipefail

need=()
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need+=(postgresql-15)
command -v psql >/dev/null || need+=(postgresql-client-15)
command -v redis-server >/dev/null || need+=(redis-server)
command -v curl >/dev/null || need+=(curl)
# Real nodes: runc links libseccomp (built with cgo), kube-proxy and the CNI
# portmap plugin program iptables, hack/images.sh builds images with
# mmdebstrap.
[[ -f /usr/include/seccomp.h ]] || need+=(libseccomp-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v gcc >/dev/null || need+=(gcc)
command -v iptables >/dev/null || need+=(iptables)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
[[ ${#need[@]} -eq 0 ]] && exit 0

echo "hack/debian-packages.sh: installing ${need[*]}"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
	if ! command -v sudo >/dev/null; then
		echo "hack/debian-packages.sh: ${need[*]} missing; install them as root: apt-get install ${need[*]}" >&2
		exit 1
	fi
	sudo=(sudo)
fi
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${need[@]}"
