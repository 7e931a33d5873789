#!/bin/sh
# Without a network nothing past loopback answers, the agent or the verifier: neither reaches
# the server the tests run on the controller's machine (SERVER_URL). Without that URL nothing
# is shown, which scores 0.
mine=$(python3 -c 'import os, urllib.request
try:
    urllib.request.urlopen(os.environ["SERVER_URL"], timeout=10)
    print("reached")
except Exception:
    print("unreachable")')
if [ -n "$SERVER_URL" ] && [ "$mine" = unreachable ] && [ "$(cat /app/fetched.txt 2>/dev/null)" = unreachable ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
