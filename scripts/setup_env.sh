#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv with Python 3.12.
# Needs only Python 3.12 and network access to the package index. Idempotent: a second run
# with unchanged setup.py / constraints.txt does nothing and returns in a second.
#   bash scripts/setup_env.sh          # core + test extras
#   LION_EXTRAS=test,notebooks bash scripts/setup_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  local c
  for c in "${PYTHON:-}" python3.12 "$HOME/.pyenv/versions"/3.12*/bin/python3.12; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    for c in "$(pyenv root)"/versions/3.12*/bin/python3.12; do
      [ -x "$c" ] && { echo "$c"; return 0; }
    done
  fi
  return 1
}

extras="${LION_EXTRAS:-test}"
stamp=".venv/.lion_jax_setup"
want="$(cat setup.py constraints.txt | sha256sum | cut -d' ' -f1) extras=$extras"
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

py="$(find_python)" || {
  echo "setup_env: Python 3.12 not found. Install it (e.g. 'pyenv install 3.12') or set PYTHON=/path/to/python3.12." >&2
  exit 1
}
echo "setup_env: creating .venv with $py"
"$py" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt -e ".[$extras]"
echo "$want" > "$stamp"
echo "setup_env: ready (.venv, extras: $extras)"
