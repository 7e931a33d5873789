#!/bin/sh
printf '%s\n' "$TASK_MODE" > /app/mode.txt
