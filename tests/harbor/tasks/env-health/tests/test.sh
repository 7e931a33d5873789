#!/bin/sh
[ "$(cat /app/mode.txt 2>/dev/null)" = "$EXPECTED_MODE" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
