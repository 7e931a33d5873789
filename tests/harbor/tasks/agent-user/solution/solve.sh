#!/bin/sh
id -un > /app/whoami.txt
