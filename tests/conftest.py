import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "validation" / "published"   # other people's measurements, with their sources


def run_cli(*args, check_rc=None):
    """Run a console script in a subprocess; returns CompletedProcess."""
    exe = shutil.which(args[0], path=os.path.dirname(sys.executable)) or args[0]
    proc = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=120)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr
    return proc


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def published():
    """The folder of published reference tables (committed, so it is never missing)."""
    return PUBLISHED


@pytest.fixture
def error_bars(monkeypatch):
    """Records (x values, xerr) of every matplotlib errorbar call while drawing still happens."""
    from matplotlib.axes import Axes

    drawn = []
    original = Axes.errorbar

    def errorbar(self, x, y, *args, xerr=None, **kwargs):
        drawn.append((list(x), xerr))
        return original(self, x, y, *args, xerr=xerr, **kwargs)

    monkeypatch.setattr(Axes, "errorbar", errorbar)
    return drawn
