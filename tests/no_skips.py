"""CI's rule (GRPO_NO_SKIPS=1, set by .ci/run): a skipped test is a failure, every real engine must run there. A
test skipped while it runs, and a module skipped while it is collected (a module-level `pytest.importorskip`), alike.
conftest.py takes these hooks in; test_ci_rules runs them as a plugin (`-p no_skips`)."""

import os

import pytest


def _failed_in_ci(report) -> None:
    if report.skipped and os.environ.get("GRPO_NO_SKIPS") == "1":
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _failed_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _failed_in_ci(outcome.get_result())
