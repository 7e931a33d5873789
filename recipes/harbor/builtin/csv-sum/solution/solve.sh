#!/bin/sh
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open("data.csv")))
open("answer.txt", "w").write(str(sum(int(r["amount"]) for r in rows)) + "\n")
PY
