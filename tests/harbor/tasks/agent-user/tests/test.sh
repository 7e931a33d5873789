#!/bin/sh
# The verifier runs as root; the file must be the agent's, written by the agent user.
expected=agent
if ! id agent >/dev/null 2>&1; then expected=$(id -un); fi  # a sandbox with one user (local)
if [ "$(cat /app/whoami.txt 2>/dev/null)" = "$expected" ] && [ "$(stat -c %U /app/whoami.txt)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
