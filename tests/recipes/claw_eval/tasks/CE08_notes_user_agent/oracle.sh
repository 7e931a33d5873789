# the scripted solution orchard's oracle policy runs (not part of Claw-Eval's format)
ask 'What was the meeting about?'
notes notes_create_note --title 'Meeting' --content 'Design team: new logo.'
claw answer 'Your note is saved.'
