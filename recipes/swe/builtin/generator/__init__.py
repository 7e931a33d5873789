"""Rebuilds ``instances.jsonl`` from the task definitions in ``tasks_*.py``.

Run ``python -m orchard_async.recipes.swe.builtin.generator --help`` (or the script
``recipes/swe/builtin/generator/gen.py`` from anywhere).
"""
