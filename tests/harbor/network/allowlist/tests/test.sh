#!/bin/sh
[ "$(cat /app/fetched.txt 2>/dev/null)" = "allowlisted-payload" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
