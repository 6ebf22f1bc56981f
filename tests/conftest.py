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


def run_ranks(argvs: list, timeout_s: float, env=None) -> list[str]:
    """Start one process per argv at once, wait for all (a crashed rank must not leave the others
    hanging: every one still running after ``timeout_s`` is killed), assert they all exited 0;
    their outputs (stdout and stderr together)."""
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for argv in argvs]
    try:
        outs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)[-3000:]
    return outs


@pytest.fixture(scope="session")
def launch_ranks():
    return run_ranks


def pid_alive(pid: int) -> bool:
    """Still running (a zombie waiting for its parent's wait counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def alive():
    return pid_alive


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


def assert_same_losses(runs: list[dict], reference: list[dict], rel: float) -> None:
    """Two training runs' step records: the same steps, losses and validation losses to ``rel``
    (validated on the same steps)."""
    assert len(runs) == len(reference)
    for a, b in zip(runs, reference):
        assert a["loss"] == pytest.approx(b["loss"], rel=rel)
        assert (a["val_loss"] is None) == (b["val_loss"] is None)
        assert a["val_loss"] is None or a["val_loss"] == pytest.approx(b["val_loss"], rel=rel)


@pytest.fixture
def same_losses():
    """``assert_same_losses``: parallel runs against the single-rank run they must reproduce."""
    return assert_same_losses


def assert_resume_continues(train, tmp_path, args: tuple):
    """``train(tmp_path, name, *args)`` for 4 steps, and for 2 with a checkpoint then resumed to
    4: the resumed run's losses are the uninterrupted run's exactly. Returns the checkpoint folder."""
    whole, _ = train(tmp_path, "whole", *args, "--steps", "4")
    ck = tmp_path / "ck"
    train(tmp_path, "part", *args, "--steps", "2", "--checkpoint", str(ck))
    resumed, _ = train(tmp_path, "part", *args, "--steps", "4", "--checkpoint", str(ck), "--resume")
    assert [r["loss"] for r in resumed] == [r["loss"] for r in whole]
    return ck


@pytest.fixture
def resume_continues():
    return assert_resume_continues


@pytest.fixture(autouse=True)
def _numba_threads_env_restored():
    """``realrun.threads.apply`` puts NUMBA_NUM_THREADS in the environment of the process it runs in (numba
    reads it at import): a test that calls it in pytest's own process must not hand it to later tests'
    subprocesses, which would take it for a user's setting."""
    before = os.environ.get("NUMBA_NUM_THREADS")
    yield
    if before is None:
        os.environ.pop("NUMBA_NUM_THREADS", None)
    else:
        os.environ["NUMBA_NUM_THREADS"] = before
