# Root conftest: makes the repository root importable so that ``minicalc``
# resolves to the in-tree package when the suite runs via ``python -m pytest``.
