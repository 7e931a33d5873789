#!/bin/sh
echo two >> /app/list.txt
cp /app/seed.txt /app/seed-copy.txt
