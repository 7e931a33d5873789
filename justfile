# The same two commands as the README's quickstart, plus lint and bench.

# install, then run the main job: a rollout on the local adapter
demo:
    pip install -e . && orchard-async demo

# install with test dependencies, then run the whole suite
test:
    pip install -e '.[dev]' && python -m pytest

# ruff, then mypy against its baseline (scripts/typecheck.py: every module of the namespace)
lint:
    ruff check . && ruff format --check orchard_async adapters bench && python scripts/typecheck.py

# exec round trip on the local adapter, next to the bare-spawn floor
bench:
    orchard-async bench exec --adapter local --json out/bench-exec-local.json
