#!/bin/sh
# A verifier that breaks Harbor's reward rules: a string where a number must be.
echo '{"reward": "full marks"}' > /logs/verifier/reward.json
