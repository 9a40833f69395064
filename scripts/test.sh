#!/usr/bin/env bash
# The whole suite: set-up if needed, lint, then every test (tests/README.md: unit, processes,
# launcher, and gpu where CUDA is).
# Extra arguments go to pytest (e.g. scripts/test.sh -k parity).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
PY="$ROOT/.venv/bin/python"
echo "== test: ruff" >&2
"$ROOT/.venv/bin/ruff" check commsched tests lint examples benchmarks/harness
# Docstrings (Google convention, pyproject.toml) of the modules that hold the public API,
# docs/api.md: ruff selects rules per run, not per file.
"$ROOT/.venv/bin/ruff" check --select D commsched/__init__.py commsched/__main__.py \
  commsched/optimizer.py commsched/compression.py commsched/config.py commsched/info.py \
  commsched/ops.py commsched/world/bootstrap.py commsched/world/broadcast.py \
  commsched/world/errors.py commsched/world/tensor_collectives.py commsched/join.py \
  commsched/kfac/__init__.py commsched/kfac/preconditioner.py \
  commsched/lightning.py
echo "== test: mypy" >&2
"$PY" -m mypy commsched tests lint benchmarks/harness
# The examples import their shared module as a sibling script does (examples/common.py).
MYPYPATH="$ROOT/examples" "$PY" -m mypy examples
# The style checks (class size, Notes, commit subjects, figures in comments, the READMEs'
# prose): a lint step, apart from the tests of what the code does.
echo "== test: lint" >&2
OMP_NUM_THREADS=1 "$PY" -m pytest lint -q -p no:cacheprovider
echo "== test: pytest" >&2
# Every rank and job the suite starts imports commsched from this checkout. Where the
# environment says not to write bytecode (PYTHONDONTWRITEBYTECODE), each of those processes
# would compile commsched's sources again (0.35 s against 0.1 s from bytecode, per process): the
# suite writes it, into the __pycache__ folders git ignores. Not under a PYTHONPYCACHEPREFIX:
# that prefix holds the bytecode of every module imported, so on a fresh clone the suite's
# processes compiled torch and the rest of .venv again instead of reading what pip wrote.
unset PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX
# Two pytest workers, each taking whole test files (so a module's shared job runs once): the
# suite's jobs leave the cores idle about a third of the time (a launcher starting, a rank
# sleeping out a timeout, a survivor waiting to name a dead peer), and a second file fills it.
# COMMSCHED_TEST_WORKERS=0 runs the suite in one process.
WORKERS="${COMMSCHED_TEST_WORKERS:-2}"
set +e
OMP_NUM_THREADS=1 "$PY" -m pytest tests -q -p no:cacheprovider --durations=15 \
  -n "$WORKERS" --dist loadfile "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure of the suite itself" >&2
  exit 1
fi
exit "$rc"
