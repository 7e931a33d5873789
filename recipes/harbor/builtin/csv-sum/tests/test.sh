#!/bin/sh
python3 /tests/check.py && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
