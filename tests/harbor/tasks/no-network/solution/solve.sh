#!/bin/sh
tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' > /app/interfaces.txt
