#!/usr/bin/env bash
# The system packages the tests start, checked (and, as root, installed) before `make test` runs them:
#   chromium + fonts-liberation  the HTML report's browser tests (tests/report/test_browser.py)
#   postgresql                   the many-workers search on a PostgreSQL storage (tests/search/test_many_workers.py)
# As root they are installed with apt-get (Debian). Otherwise, when one is missing, this prints the one
# command to run and exits 1, so that `make test` stops before the tests.
set -euo pipefail

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
if command -v dpkg-query >/dev/null 2>&1; then
  installed fonts-liberation || need+=(fonts-liberation)
fi
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing the system packages the tests need: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  exit 0
fi

echo "the tests need system packages that are missing: ${need[*]}" >&2
echo "install them, then rerun make test:" >&2
echo "  sudo apt-get install -y --no-install-recommends ${need[*]}" >&2
exit 1
