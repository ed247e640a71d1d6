#!/usr/bin/env bash
# The Python SDK's tools: a venv at .tools/py-sdk with clients/python installed
# editable (plus its test extra), hatchling and build. Idempotent: a stamp holds
# the hash of pyproject.toml (and of this script), so a repeated run only hashes
# two files.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.tools/py-sdk"
PROJECT="$ROOT/clients/python"
# The build backend (with editables, which its editable installs need) and
# frontend are pinned here (not resolved per run) so that
# `python -m build --no-isolation` works without a registry round trip.
HATCHLING_VERSION=1.33.0
BUILD_VERSION=1.6.1
EDITABLES_VERSION=0.6

stamp="$VENV/.postguard-stamp"
want=$(cat "$PROJECT/pyproject.toml" "$0" | sha256sum | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

printf '\033[1m==> %s\033[0m\n' "Python SDK venv (.tools/py-sdk)"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check --no-input -q "$@"; }
pip install "hatchling==$HATCHLING_VERSION" "editables==$EDITABLES_VERSION" "build==$BUILD_VERSION"
# --no-build-isolation: the editable install uses the hatchling just installed.
pip install --no-build-isolation -e "$PROJECT[test]"
echo "$want" > "$stamp"
