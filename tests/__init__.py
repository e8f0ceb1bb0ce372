"""The test suite, a package so that tests and benchmarks import its helpers as ``tests.support`` and
the test-only fault proposers as ``tests.faults`` (with the checkout on ``sys.path``)."""
