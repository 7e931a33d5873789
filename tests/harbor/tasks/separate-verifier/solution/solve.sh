#!/bin/sh
mkdir -p /app/scratch && echo "sieve notes" > /app/scratch/notes.txt
python3 -c "import json; json.dump({'primes': [p for p in range(2, 30) if all(p % d for d in range(2, p))]}, open('/app/report.json', 'w'))"
echo "done" > /logs/artifacts/agent-log.txt
