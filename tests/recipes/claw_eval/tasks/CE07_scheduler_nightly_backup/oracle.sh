# the scripted solution orchard's oracle policy runs (not part of Claw-Eval's format)
scheduler scheduler_list_jobs
scheduler scheduler_create_job --name nightly-backup --cron '0 2 * * *' --command backup.sh
claw answer 'Created nightly-backup (0 2 * * *).'
