"""Files copied into a Harbor task's sandbox (the harness policy's bundled harness)."""
