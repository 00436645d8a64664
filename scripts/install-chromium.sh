#!/usr/bin/env bash
# install-chromium.sh — install the browser the console's end-to-end tests drive
# (console/e2e_test.go): Debian's `chromium` package at /usr/bin/chromium. A no-op when it
# is there. Never a browser build downloaded by a tool: the system's package only.
#
#   scripts/install-chromium.sh
set -euo pipefail

CHROMIUM=${CHESSD_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
	exit 0
fi
if ! command -v apt-get >/dev/null; then
	echo "install-chromium: $CHROMIUM is missing and there is no apt-get: install Chromium and set CHESSD_CHROMIUM" >&2
	exit 1
fi
SUDO=
if [ "$(id -u)" -ne 0 ]; then
	SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
echo "install-chromium: installing Debian's chromium package" >&2
# The package lists may be stale or absent on a fresh machine: update once and retry.
if ! $SUDO apt-get install -y --no-install-recommends chromium >/dev/null; then
	$SUDO apt-get update >/dev/null
	$SUDO apt-get install -y --no-install-recommends chromium >/dev/null
fi
"$CHROMIUM" --version >&2
