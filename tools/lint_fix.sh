#!/usr/bin/env bash
# Apply what `make lint` checks: ruff's safe fixes (import order, newer syntax, unused imports, ...) and the
# formatter, then rewrite each notebook's .ipynb from its paired script (a fix may have changed the script;
# tests/test_notebook_pairing.py requires the pair to agree). Prints what is left for a person to fix.
# Usage: tools/lint_fix.sh [PYTHON]   (default: .venv/bin/python, what `make setup` creates)
set -uo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
"$python" -m ruff check --fix --silent . || true
"$python" -m ruff format --quiet .
"$python" -m jupytext --quiet --update --to ipynb notebooks/[0-9][0-9]_*.py
echo "left for a person (ruff check):"
"$python" -m ruff check --statistics . && echo "  nothing"
