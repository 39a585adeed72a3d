"""The test suite. Its modules are named tests.*, which the warning filters match on."""
