"""The one exception the test bed raises for its own failures."""


class TestbedError(RuntimeError):
    """The test bed itself failed (not the code under test)."""

    __test__ = False  # not a pytest test class despite the name
