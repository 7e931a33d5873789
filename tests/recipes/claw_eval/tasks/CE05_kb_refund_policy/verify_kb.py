import pathlib
import sys

p = pathlib.Path("results/answer.md")
ok = p.is_file() and "30 days" in p.read_text()
print("VERIFIED" if ok else "MISSING")
sys.exit(0 if ok else 1)
