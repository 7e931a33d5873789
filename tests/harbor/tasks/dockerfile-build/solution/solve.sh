#!/bin/sh
tr a-z A-Z < /app/words.txt > /app/shout.txt
echo "$GREETING" >> /app/shout.txt
