#!/usr/bin/env bash
# Run the course's own test suite (a checkout of CS336 assignment 2, spring 2025 or spring 2026)
# against this library, unchanged but for its adapters:
#   tools/course_suite.sh PATH_TO_COURSE_CHECKOUT [pytest arguments]
# A copy of its tests/ is taken whose adapters.py is the one line `from cs336_systems.adapters
# import *`; its own cs336_basics (the toy models' layer classes) is put on the path, and its
# cs336_systems stub is left out so that this library is the one imported. The course's tests
# need einops, einx and jaxtyping (pip install einops einx jaxtyping).
set -euo pipefail
usage="usage: tools/course_suite.sh PATH_TO_COURSE_CHECKOUT [pytest arguments]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
[ -d "$1/tests" ] || { printf '%s\n' "$1 has no tests/ folder: not a checkout of the course's assignment 2" "$usage" >&2; exit 2; }
course=$(cd "$1" && pwd); shift
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
[ -x "$python" ] || python=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$course/tests" "$work/tests"
echo "from cs336_systems.adapters import *" > "$work/tests/adapters.py"
cd "$work"
PYTHONPATH="$here/lib:$course/cs336-basics${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest -q -p no:cacheprovider tests "$@"
