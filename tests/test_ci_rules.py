"""CI's rules on the suite itself: a skip is a failure there, whenever the test is skipped."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SKIPPED = {
    "at collection": "import pytest\npytest.importorskip('no_such_module_grpo')\n\ndef test_x():\n    pass\n",
    "while running": "import pytest\n\ndef test_x():\n    pytest.skip('not here')\n",
    "by a mark": "import pytest\n\n@pytest.mark.skipif(True, reason='not here')\ndef test_x():\n    pass\n",
}


@pytest.mark.parametrize("when", list(SKIPPED))
def test_a_skip_fails_in_ci(tmp_path, when):
    (tmp_path / "test_skipped.py").write_text(SKIPPED[when])

    def pytest_run(ci: bool) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "GRPO_NO_SKIPS": "1" if ci else "0",
               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no_skips", "-p", "no:cacheprovider", "-q",
                               "-rA", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True)

    local, ci = pytest_run(ci=False), pytest_run(ci=True)
    assert "1 skipped" in local.stdout and local.returncode in (0, 5), local.stdout  # 5: no test left to run
    assert ci.returncode in (1, 2) and "skipped in CI, where every test must run" in ci.stdout, ci.stdout
