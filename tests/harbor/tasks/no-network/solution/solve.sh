#!/bin/sh
python3 - <<'PY'
import os
import urllib.request

try:
    body = urllib.request.urlopen(os.environ["SERVER_URL"], timeout=10).read().decode()
except Exception:
    body = "unreachable"
with open("/app/fetched.txt", "w") as out:
    out.write(body)
print(body)
PY
