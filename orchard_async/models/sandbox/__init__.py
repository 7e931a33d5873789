"""Files copied into an agent's sandbox for every bundled harness (``orchard_async.models.harness``)."""
