# the scripted solution orchard's oracle policy runs (not part of Claw-Eval's format)
gmail gmail_list_messages --max_results 5
gmail gmail_get_message --message_id msg_001
curl -s -X POST -H 'Content-Type: application/json' -d '{"to": "dana@client.example", "subject": "Re: Quote for 40 chairs", "body": "Confirmed: 1,240 EUR."}' http://localhost:9100/gmail/send || gmail gmail_send_message --to dana@client.example --subject 'Re: Quote for 40 chairs' --body 'Confirmed: 1,240 EUR.'
claw answer 'I replied to Dana confirming the quote of 1,240 EUR.'
