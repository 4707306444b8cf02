"""Shared test support code (fixtures and helpers), importable as ``support``.

``pythonpath = ["tests"]`` in pyproject.toml puts this package on ``sys.path``;
``tests/conftest.py`` loads the fixtures in :mod:`support.cluster` as a plugin.
"""
