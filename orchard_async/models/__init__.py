"""Model clients: the OpenAI-compatible chat client the recipes' policies share (its retries are
``orchard_async.kit.retry``'s), and the recording proxy for harnesses that call a model themselves."""
