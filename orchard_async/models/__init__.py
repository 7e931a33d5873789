"""Model clients: the OpenAI-compatible chat client the recipes' policies share, one retry policy
with one ``Retry-After`` reader, and the recording proxy for harnesses that call a model themselves."""
