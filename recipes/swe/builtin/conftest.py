# The repositories under repos/ are task data with their own (intentionally
# buggy) code and test suites; the project's pytest run must never collect them.
# They are validated by tests/recipes/test_swe_builtin_data.py instead, which
# runs each suite in a materialized temporary git checkout.
collect_ignore_glob = ["*"]
