#!/bin/sh
# Runs in its own environment: only the artifacts came over, not the agent's scratch files.
python3 - <<'PY'
import json, pathlib
ok = True
try:
    ok = json.load(open("/app/report.json"))["primes"] == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]
except Exception:
    ok = False
separate = not pathlib.Path("/app/scratch").exists()
pathlib.Path("/logs/verifier/reward.txt").write_text("1" if ok and separate else "0")
PY
