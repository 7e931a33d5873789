#!/bin/sh
[ "$(cat /app/list.txt 2>/dev/null)" = "one
two" ] && cmp -s /app/seed.txt /app/seed-copy.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
