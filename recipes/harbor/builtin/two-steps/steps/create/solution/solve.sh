#!/bin/sh
echo one > /app/list.txt
