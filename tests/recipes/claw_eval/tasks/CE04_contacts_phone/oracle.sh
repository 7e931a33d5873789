# the scripted solution orchard's oracle policy runs (not part of Claw-Eval's format)
contacts contacts_search --query Omar
contacts contacts_get --contact_id c1
claw answer 'Omar Haddad can be reached on extension 4417.'
