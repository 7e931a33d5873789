# the scripted solution orchard's oracle policy runs (not part of Claw-Eval's format)
todo todo_list_tasks
todo todo_complete_task --task_id t1
claw answer 'Done: Send invoice. Open: Book venue.'
