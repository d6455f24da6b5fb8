#!/usr/bin/env bash
# azurite.sh installs Azurite, Microsoft's Azure Storage emulator, from the
# npm registry into bin/azurite: the backup tests store to its blob service.
# Pinned; installed again only when the version changes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="3.37.0"
dir="${root}/bin/azurite"
if [[ -x "${dir}/node_modules/.bin/azurite-blob" && "$(cat "${dir}/.version" 2>/dev/null)" == "${version}" ]]; then
	exit 0
fi
command -v npm >/dev/null || { echo "azurite.sh: npm is required (Node.js)" >&2; exit 1; }
rm -rf "${dir}"
mkdir -p "${dir}"
npm install --prefix "${dir}" --no-audit --no-fund --loglevel=error "azurite@${version}"
echo "${version}" > "${dir}/.version"
