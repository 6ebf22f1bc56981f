"""Every process realrun starts is isolated from the current folder, every wait on one is
bounded and checks that it lives, a failed one reports its own last line, and killing the
parent with SIGKILL still stops them and removes their temporary folders."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from realrun import procs
from realrun.bench.instep import in_step
from realrun.cluster import launch
from topologies.errors import RunError

PLANTED = ("socket", "json", "numpy", "runpy", "multiprocessing", "realrun", "torch")


def _plant(folder) -> None:
    """Modules and packages of names every rank imports, each leaving a mark when imported."""
    for name in PLANTED:
        mark = f"open({str(folder / ('IMPORTED-' + name))!r}, 'w').close()\nraise ImportError('planted')\n"
        if name in ("multiprocessing", "realrun"):
            (folder / name).mkdir()
            (folder / name / "__init__.py").write_text(mark)
        else:
            (folder / f"{name}.py").write_text(mark)


def _exe(name: str) -> str:
    return shutil.which(name, path=os.path.dirname(sys.executable)) or name


LAUNCHERS = {
    "bench": [_exe("realrun"), "bench", "allreduce", "--world", "2", "--sizes", "4KiB", "--compressors", "none",
              "--iters", "1"],
    "train": [_exe("realrun"), "train", "--steps", "1", "--seq", "16", "--eval-every", "0"],
    # calibrate's in-step helpers (what `realrun calibrate` runs for kernels and compute), from a
    # script elsewhere, as a console script runs: the parent's own sys.path lacks the folder
    "calibrate": [sys.executable, "{scripts}/calibrate_helpers.py"],
}
CALIBRATE = ("from realrun.bench.kernels import run_kernels_shared\n"
             "run_kernels_shared([4096], ['int8'], iters=1, ranks=2)\n")


@pytest.mark.distributed
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_no_launcher_imports_modules_of_the_current_folder(launcher, tmp_path):
    pytest.importorskip("torch")
    work, scripts = tmp_path / "work", tmp_path / "scripts"
    work.mkdir()
    scripts.mkdir()
    _plant(work)
    (scripts / "calibrate_helpers.py").write_text(CALIBRATE)
    argv = [a.format(scripts=scripts) for a in LAUNCHERS[launcher]]
    proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in work.glob("IMPORTED-*")) == []


def test_cluster_run_starts_python_modules_without_the_current_folder(tmp_path):
    """The documented ``cluster run -- python -m realrun.cli ...`` (and ``-c``) run with -P; a script
    keeps its own folder (the user's code); other commands are left as they are."""
    argv = launch.python_of_this_environment(["python", "-m", "json.tool", "--help"])
    assert argv == procs.python_argv("json.tool", "--help")
    assert launch.python_of_this_environment(["ls", "-l"]) == ["ls", "-l"]
    assert launch.python_of_this_environment(["python3", "train.py"]) == [sys.executable, "train.py"]
    (tmp_path / "json.py").write_text("open('IMPORTED', 'w').close()\n")
    for command in (["python", "-m", "json.tool", "--help"], ["python", "-c", "import json"]):
        subprocess.run(launch.python_of_this_environment(command), cwd=tmp_path, capture_output=True, timeout=60)
    assert not (tmp_path / "IMPORTED").exists()


@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
                    reason="needs root and iproute2 (ip, tc)")
def test_cluster_run_ranks_ignore_the_current_folder(tmp_path, monkeypatch):
    from realrun.cluster import down, emulated, up

    monkeypatch.setattr(emulated, "STATE_DIR", str(tmp_path / "state"))
    name = f"i{os.getpid() % 100000}"
    work = tmp_path / "work"
    work.mkdir()
    (work / "json.py").write_text(f"open({str(work / 'IMPORTED')!r}, 'w').close()\n")
    monkeypatch.chdir(work)
    try:
        up(emulated.EmulatedSpec(hosts=2, bandwidth="1gbit"), name)
        launch.run(name, ["python", "-m", "json.tool", str(tmp_path / "state" / f"{name}.json")], timeout_s=60)
    finally:
        down(name)
    assert not (work / "IMPORTED").exists()


def _helper_module(tmp_path, monkeypatch, body: str):
    """A worker module the helpers can import (on PYTHONPATH), imported here too."""
    (tmp_path / "helper_work.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    sys.modules.pop("helper_work", None)
    import helper_work

    return helper_work


def test_a_dead_helper_ends_the_call_with_its_own_last_line(tmp_path, monkeypatch):
    work = _helper_module(tmp_path, monkeypatch, """
        import os, sys
        def work(barrier, queue, fail):
            barrier.wait()
            if os.environ.get("HELPER_FAIL") == "1" or fail:
                sys.exit("helper broke: out of input")
            barrier.wait()
            queue.put([1, 2])
    """)
    assert in_step(work.work, (False,), ranks=2, timeout_s=60) == [[1, 2], [1, 2]]
    with pytest.raises(RunError, match=r"helper \d of 2 ended \(exit 1\): helper broke: out of input"):
        in_step(work.work, (True,), ranks=2, timeout_s=600)   # found dead, long before the timeout


def test_a_silent_helper_ends_the_call_at_the_timeout(tmp_path, monkeypatch):
    work = _helper_module(tmp_path, monkeypatch, """
        import time
        def work(barrier, queue):
            time.sleep(3600)
    """)
    with pytest.raises(RunError, match=r"helper 0, 1 of 2 said nothing for 1 s"):
        in_step(work.work, (), ranks=2, timeout_s=1)


def test_the_rank_that_died_first_is_named_with_its_own_line(capfd):
    """Rank 1 is killed; rank 0 then fails with a traceback (its peer is gone): the error names
    rank 1, and rank 0's traceback is never shown."""
    consequence = "import sys, time; print('started', file=sys.stderr); time.sleep(1); raise ConnectionError('peer')"
    ranks = [procs.start([sys.executable, "-c", consequence]),
             procs.start([sys.executable, "-c", "import os, time; time.sleep(0.3); os.kill(os.getpid(), 9)"],
                         quiet=True)]
    try:
        with pytest.raises(RunError) as err:
            procs.wait_all(ranks, timeout_s=30)
        time.sleep(1.5)   # rank 0's traceback would be written by now
    finally:
        procs.stop_all(ranks)
    assert str(err.value).startswith("rank 1 of 2 failed (killed by signal 9 (SIGKILL)): no error output")
    shown = capfd.readouterr().err
    assert "started" in shown and "Traceback" not in shown and "ConnectionError" not in shown


def test_a_killed_rank_0_reports_what_it_said_last():
    ranks = [procs.start([sys.executable, "-c", "import os, sys, time; print('step 3', file=sys.stderr, "
                          "flush=True); time.sleep(0.5); os.kill(os.getpid(), 9)"]),
             procs.start([sys.executable, "-c", "import time; time.sleep(30)"], quiet=True)]
    try:
        with pytest.raises(RunError, match=r"rank 0 of 2 failed \(killed by signal 9 \(SIGKILL\)\): step 3;"):
            procs.wait_all(ranks, timeout_s=30)
    finally:
        procs.stop_all(ranks)


def test_output_held_back_is_shown_when_every_rank_succeeds(capfd):
    ranks = [procs.start([sys.executable, "-c", "import warnings, traceback, sys\n"
                          "try:\n    1/0\nexcept ZeroDivisionError:\n    traceback.print_exc()\n"])]
    try:
        procs.wait_all(ranks, timeout_s=30)
    finally:
        procs.stop_all(ranks)
    assert "ZeroDivisionError" in capfd.readouterr().err



def _wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.distributed
def test_kill_9_of_the_parent_stops_the_ranks_and_removes_their_temporary_folder(tmp_path, alive):
    pytest.importorskip("torch")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    parent = subprocess.Popen([_exe("realrun"), "bench", "allreduce", "--world", "2", "--sizes", "16MiB",
                               "--compressors", "none", "--iters", "400"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: list(tmp.glob("commpress-*/store*"))), "the ranks did not start"
        ranks = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent_of(int(p)) == parent.pid
                 and "realrun.bench" in _cmdline(int(p))]
        assert len(ranks) == 2
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert _wait_for(lambda: not any(alive(r) for r in ranks)), "ranks outlived their parent"
    assert _wait_for(lambda: not list(tmp.glob("commpress-*"))), "the temporary folder was left behind"


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
