"""What a test does when an input it reads (a model, evaluation data, a built
binary) is absent: outside CI it skips, naming the command that fetches the
input; under CI it fails with that message, since the test command fetches
every input first (the C++ twin: tests/missing_input.h)."""

import os
import unittest


def inputs_required() -> bool:
    """True when CI is set to anything but "", "0" or "false"."""
    return os.environ.get("CI", "") not in ("", "0", "false")


def missing_input(message: str):
    """Raises: a failure under CI, a skip otherwise (also from setUpClass)."""
    if inputs_required():
        raise AssertionError(f"missing test input (CI is set: a missing input fails): {message}")
    raise unittest.SkipTest(f"missing test input: {message}")
