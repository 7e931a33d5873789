# the scripted solution orchard's oracle policy runs (not part of Claw-Eval's format)
kb kb_search --query refund
kb kb_get_article --article_id kb1
mkdir -p results && echo 'Refund window: 30 days' > results/answer.md
claw answer "The refund window is 30 days (see results/answer.md).$(ls verify_kb.py 2>/dev/null)"
