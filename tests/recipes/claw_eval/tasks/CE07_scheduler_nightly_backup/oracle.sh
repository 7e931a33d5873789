# the scripted solution orchard's oracle policy runs (not part of Claw-Eval's format)
printf '%s\n' '{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}' '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "scheduler__scheduler_list_jobs", "arguments": {}}}' | claw mcp | grep -q weekly-report
scheduler scheduler_create_job --name nightly-backup --cron '0 2 * * *' --command backup.sh
claw answer 'Created nightly-backup (0 2 * * *).'
