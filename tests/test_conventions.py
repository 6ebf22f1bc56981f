"""Conventions every command keeps: --version, the environment's python under realrun."""
import sys

import pytest

from realrun.cluster.launch import python_of_this_environment
from realrun.procs import python_argv


@pytest.mark.parametrize("argv", [["perfmodel", "--version"], ["perfmodel", "search", "--version"],
                                  ["realrun", "--version"], ["topologies", "--version"]])
def test_every_command_has_a_version(cli, argv):
    out = cli(*argv, check_rc=0).stdout
    assert "commpress" in out and argv[0] in out


def test_python_means_this_environment_s_interpreter():
    # a module runs without the current folder on sys.path (procs.python_argv: -P)
    assert python_of_this_environment(["python", "-m", "realrun.cli"]) == python_argv("realrun.cli")
    assert python_of_this_environment(["python3", "x.py"])[0] == sys.executable
    assert python_of_this_environment(["/usr/bin/env", "python"]) == ["/usr/bin/env", "python"]


@pytest.mark.parametrize("command", ["predict", "compare", "sweep", "search"])
def test_predictions_ask_for_model_and_cluster(cli, command):
    proc = cli("perfmodel", command, check_rc=2)
    assert "--model" in proc.stderr and "--cluster" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_nccl_tests_type_names(cli):
    out = cli("perfmodel", "collective", "allreduce", "--cluster", "dgx-a100", "--nodes", "1", "--size", "1MiB",
              "--dtype", "bfloat16", check_rc=0).stdout
    assert "dtype=bfloat16" in out and " bfloat16 " in out
    same = cli("perfmodel", "collective", "allreduce", "--cluster", "dgx-a100", "--nodes", "1", "--size", "1MiB",
               "--dtype", "bf16", "--json", check_rc=0).stdout
    assert '"dtype": "bf16"' in same
    bad = cli("perfmodel", "collective", "allreduce", "--dtype", "double", check_rc=2)
    assert "float, half or bfloat16" in bad.stderr


def test_a_failed_rank_says_which_and_what_happened():
    from realrun import procs
    from topologies.errors import InputError, RunError

    ranks = [procs.start([sys.executable, "-c", "import time; time.sleep(5)"], quiet=True),
             procs.start([sys.executable, "-c", "import sys; sys.exit('no data here')"], quiet=True)]
    try:
        with pytest.raises(RunError) as err:
            procs.wait_all(ranks, timeout_s=30)
    finally:
        procs.stop_all(ranks)
    text = str(err.value)
    assert text.startswith("rank 1 of 2 failed (exit 1): no data here") and "\n" not in text
    assert isinstance(err.value, InputError) and err.value.field == "rank"
    assert all(p.poll() is not None for p in ranks)      # the sleeping rank was stopped too


def test_help_shows_defaults(cli):
    out = cli("perfmodel", "predict", "--help", check_rc=0).stdout
    assert "(default: 1f1b)" in out and "(default: analytical)" in out
    assert "(default: 25MiB)" in out or "25MiB" in out


def test_wrong_elements_count_what_the_spec_does_not_allow():
    torch = pytest.importorskip("torch")
    from realrun.bench.worker import wrong_elements

    exact = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    assert wrong_elements("none", exact.clone(), exact) == 0
    bad = exact.clone()
    bad[3], bad[7] = float("nan"), bad[7] + 1.0
    assert wrong_elements("none", bad, exact) == 2
    assert wrong_elements("lossless", bad, exact) == 2
    noisy = exact + 0.01 * torch.randn(10_000, generator=torch.Generator().manual_seed(1))
    assert wrong_elements("int8", noisy, exact) == 0          # 1% noise within 10x int8's predicted 0.8%
    noisy[5] += 5.0
    assert wrong_elements("int8", noisy, exact) == 1


@pytest.mark.parametrize("module", ["perfmodel.cli", "realrun.cli", "topologies.cli"])
def test_commands_import_without_the_heavy_libraries(module):
    """What made imports slow (numba, scipy.stats, scipy's graph routines, torch) loads when used."""
    import subprocess

    code = (f"import sys, {module}; heavy = [m for m in ('numba', 'scipy.stats', 'scipy.sparse.csgraph', 'torch') "
            "if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", out
