#!/usr/bin/env bash
# images.sh builds the root filesystems of the images the real nodes run,
# from Debian's packages (mmdebstrap, with apt's own sources), into
# bin/images/<name>.tar; the tests push them to the cluster's registry.
# A root filesystem is rebuilt only when its package list changes (a stamp
# beside it) and is kept in the tools cache like the control plane, so a
# fresh clone on the same machine copies it. Needs root (mmdebstrap's root
# mode) and mmdebstrap (hack/debian-packages.sh installs it).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${root}/bin/images"
mkdir -p "${out}"
cache="${CHARTPILOT_TOOLS_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/chartpilot/tools}"

# name=packages (comma-separated)
images=(
	"redis=redis-server"
	"postgresql=postgresql-15,postgresql-client-15,prometheus-postgres-exporter"
)
# Commands run in an image's new root filesystem before it is packed.
declare -A customize=(
	# The chart runs PostgreSQL as UID and GID 999 (the official image's
	# postgres user; initdb needs the user in /etc/passwd). The cluster
	# Debian's package makes at install time is not needed.
	[postgresql]='if getent passwd 999 >/dev/null; then echo "UID 999 is taken: $(getent passwd 999)" >&2; exit 1; fi
usermod -u 999 postgres && groupmod -g 999 postgres
rm -rf /var/lib/postgresql/15/main /etc/postgresql/15/main'
)
# Documentation, manual pages and translations are left out of every image.
excludes=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*')

for entry in "${images[@]}"; do
	name="${entry%%=*}"
	packages="${entry#*=}"
	stamp="$(printf '%s\n%s\n' "${packages}" "$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)" | sha256sum | cut -d' ' -f1)"
	if [[ -f "${out}/${name}.tar" && "$(cat "${out}/${name}.stamp" 2>/dev/null)" == "${stamp}" ]]; then
		continue
	fi
	if [[ "${CHARTPILOT_TOOLS_CACHE:-}" != off && -f "${cache}/image-${name}-${stamp}.tar" ]]; then
		cp "${cache}/image-${name}-${stamp}.tar" "${out}/${name}.tar.tmp"
		mv "${out}/${name}.tar.tmp" "${out}/${name}.tar"
		echo "${stamp}" >"${out}/${name}.stamp"
		echo "copied image ${name} from ${cache}" >&2
		continue
	fi
	if [[ $(id -u) -ne 0 ]]; then
		echo "hack/images.sh: building the ${name} image needs root (mmdebstrap): run make tools as root" >&2
		exit 1
	fi
	echo "building image ${name} (${packages}) from Debian's packages" >&2
	start=${SECONDS}
	hook=()
	if [[ -n "${customize[${name}]:-}" ]]; then
		hook=(--customize-hook="chroot \"\$1\" sh -euc '${customize[${name}]}'")
	fi
	mmdebstrap --quiet --variant=essential "${excludes[@]}" "${hook[@]}" --include="${packages}" --format=tar bookworm "${out}/${name}.tar.tmp"
	mv "${out}/${name}.tar.tmp" "${out}/${name}.tar"
	echo "${stamp}" >"${out}/${name}.stamp"
	if [[ "${CHARTPILOT_TOOLS_CACHE:-}" != off ]] && mkdir -p "${cache}" 2>/dev/null; then
		cp "${out}/${name}.tar" "${cache}/image-${name}-${stamp}.tar"
	fi
	echo "built image ${name} in $((SECONDS - start))s" >&2
done
