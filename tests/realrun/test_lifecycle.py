"""Process life cycles: signals end a command and its ranks, a stalled rank is detected, rank
processes never import from the current folder, clikit's last-resort errors are one line."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from realrun import procs
from topologies import clikit
from topologies.errors import InputError


def _main_raising(exc):
    def main(argv):
        raise exc
    return main


@pytest.mark.parametrize("exc, code, text", [
    (KeyboardInterrupt(), 130, "interrupted"),
    (clikit.Terminated(), 143, "terminated"),
    (RecursionError(), 2, "nested too deeply"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), 2, "not UTF-8"),
    (MemoryError(), 2, "not enough memory"),
    (PermissionError(13, "Permission denied", "/x"), 2, "/x: Permission denied"),
    (InputError("field", 3, "allowed"), 2, "field=3: allowed"),
])
def test_run_turns_last_resort_errors_into_one_line(exc, code, text, capsys):
    assert clikit.run(_main_raising(exc)) == code
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1 and "Traceback" not in err


def test_sigterm_becomes_an_exception_so_cleanup_runs(capsys):
    cleaned = []

    def main(argv):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            cleaned.append(True)

    assert clikit.run(main) == 143 and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is not clikit._terminate


def test_ranks_never_import_from_the_current_folder(tmp_path):
    (tmp_path / "json.py").write_text("open('HIJACKED', 'w').close()\n")
    subprocess.run(procs.python_argv("json.tool", "--help"), cwd=tmp_path, capture_output=True, timeout=60)
    assert not (tmp_path / "HIJACKED").exists()
    subprocess.run([sys.executable, "-m", "json.tool", "--help"], cwd=tmp_path, capture_output=True, timeout=60)
    assert (tmp_path / "HIJACKED").exists()   # the hazard the -P flag removes


def test_wait_all_names_the_failed_rank_and_stop_all_ends_groups():
    ok = procs.start([sys.executable, "-c", "import time; time.sleep(60)"])
    bad = procs.start([sys.executable, "-c", "import sys; sys.exit('rank broke')"], quiet=True)
    try:
        with pytest.raises(InputError, match="rank 1 of 2 failed.*rank broke"):
            procs.wait_all([ok, bad], timeout_s=30)
    finally:
        procs.stop_all([ok, bad])
    assert ok.poll() is not None


def _children(pid: int, running: str = "realrun.bench") -> list[int]:
    """The children of ``pid`` whose command line names ``running`` (the ranks; not the watchdog)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    cmd = handle.read().decode(errors="replace")
            except OSError:
                continue
            if int(fields[1]) == pid and running in cmd:
                out.append(int(entry))
    return out



def _bench(*extra):
    exe = shutil.which("realrun", path=os.path.dirname(sys.executable)) or "realrun"
    return subprocess.Popen([exe, "bench", "allreduce", "--world", "2", "--sizes", "16MiB", "--compressors",
                             "none", "--iters", "400", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _ranks_started(proc, timeout_s=60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ranks = _children(proc.pid)
        if len(ranks) == 2:
            time.sleep(3)   # past their imports, inside the benchmark
            return ranks
        time.sleep(0.2)
    pytest.fail("ranks did not start")


@pytest.mark.distributed
def test_sigterm_ends_bench_and_every_rank(alive):
    pytest.importorskip("torch")
    proc = _bench()
    ranks = _ranks_started(proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "terminated" in err and "Traceback" not in err
    time.sleep(0.5)
    assert not [r for r in ranks if alive(r)]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_stopped_rank_ends_the_run_within_the_op_timeout():
    pytest.importorskip("torch")
    proc = _bench("--op-timeout", "5")
    ranks = _ranks_started(proc)
    os.kill(ranks[1], signal.SIGSTOP)
    start = time.monotonic()
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        for r in ranks:
            if os.path.exists(f"/proc/{r}"):
                os.kill(r, signal.SIGKILL)
    assert proc.returncode == 2 and "rank 0 of" in err and time.monotonic() - start < 60
