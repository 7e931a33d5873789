#!/bin/sh
# Without a network, loopback is the only interface (the verifier has none either).
mine=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ')
if [ "$mine" = lo ] && [ "$(cat /app/interfaces.txt 2>/dev/null)" = lo ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
