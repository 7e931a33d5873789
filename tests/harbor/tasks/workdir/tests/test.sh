#!/bin/sh
[ "$(pwd)" = /srv/work ] && [ "$(cat /srv/work/notes/today.txt 2>/dev/null)" = /srv/work ] \
  && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
