"""A stand-in for Claw-Eval's package in orchard's tests: just the grader-loading entry
(``graders.registry.get_grader``) and the models a grader.py receives, written for the tests."""
