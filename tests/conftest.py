import pytest

from prereq import IN_CI  # tests/ is on sys.path: pytest puts a test directory without __init__.py there


def _skipped(config: pytest.Config) -> list:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return reporter.stats.get("skipped", []) if reporter else []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI the unit suite may not skip: any skip (one that bypassed prereq.unavailable) fails the run."""
    if IN_CI and _skipped(session.config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    skipped = _skipped(config)
    if IN_CI and skipped:
        terminalreporter.section("CI=true: skips fail the run", red=True)
        for rep in skipped:
            reason = rep.longrepr[-1] if isinstance(rep.longrepr, tuple) else rep.longrepr
            terminalreporter.write_line(f"{rep.nodeid}: {reason}")


@pytest.fixture(autouse=True)
def memory():
    """What the operator process remembers between passes (tests/process_memory.py): a new process per test."""
    import process_memory
    return process_memory.new_process()
