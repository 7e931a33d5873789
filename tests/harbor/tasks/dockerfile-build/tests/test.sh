#!/bin/sh
expected="ALPHA BETA
GAMMA
built here"
if [ "$(cat /app/count.txt)" = 3 ] && [ "$(cat /app/shout.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
