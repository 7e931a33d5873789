# the scripted solution orchard's oracle policy runs (not part of Claw-Eval's format)
echo '[{"id": "1", "name": "todo__todo_list_tasks", "arguments": "{}"}]' | claw batch
todo todo_complete_task --task_id t1
claw answer 'Done: Send invoice. Open: Book venue.'
