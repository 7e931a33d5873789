# the scripted solution orchard's oracle policy runs (not part of Claw-Eval's format)
inventory inventory_list_items
inventory inventory_update_item --item_id i1 --quantity 20
inventory inventory_update_item --item_id i2 --quantity 20
claw answer 'Restocked Cable and Plug to 20.'
