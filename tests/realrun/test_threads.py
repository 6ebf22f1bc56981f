"""A rank's codec threads (realrun.threads): the host's cores over the ranks on it, overridden by
an explicit count, then COMMPRESS_CODEC_THREADS; a user's NUMBA_NUM_THREADS is kept."""
import threading

import pytest

from realrun import threads
from topologies.errors import InputError

VARS = (threads.ENV, "NUMBA_NUM_THREADS", *threads.LOCAL_SIZE_VARS)


@pytest.fixture
def clean_env(monkeypatch):
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(threads, "_own_numba_env", [])   # what an earlier test's apply wrote is not this test's
    return monkeypatch


@pytest.mark.parametrize(("cores", "local", "expected"), [(2, 2, 1), (2, 1, 2), (16, 2, 8), (16, 3, 5), (2, 4, 1),
                                                          (1, 1, 1), (96, 8, 12)])
def test_default_is_cores_over_local_ranks_at_least_one(clean_env, cores, local, expected):
    assert threads.codec_threads(cores=cores, local=local) == expected


def test_local_ranks_come_from_the_launcher(clean_env):
    assert threads.local_ranks() == 1                      # no launcher, no process group
    clean_env.setenv("MPI_LOCALNRANKS", "3")
    assert threads.local_ranks() == 3
    clean_env.setenv("LOCAL_WORLD_SIZE", "4")              # torchrun's comes first
    assert threads.local_ranks() == 4
    assert threads.codec_threads(cores=16) == 4
    clean_env.setenv("LOCAL_WORLD_SIZE", "zero")
    with pytest.raises(InputError) as err:
        threads.local_ranks()
    assert err.value.field == "LOCAL_WORLD_SIZE"


def test_cores_are_the_affinity_mask():
    import os

    assert threads.host_cores() == len(os.sched_getaffinity(0))


def test_explicit_count_then_the_environment_override_the_default(clean_env):
    clean_env.setenv("LOCAL_WORLD_SIZE", "2")
    clean_env.setenv(threads.ENV, "3")
    assert threads.codec_threads(cores=16) == 3
    assert threads.codec_threads(5, cores=16) == 5
    for bad in ("0", "-1", "two", "1.5"):
        clean_env.setenv(threads.ENV, bad)
        with pytest.raises(InputError) as err:
            threads.codec_threads()
        assert err.value.field == threads.ENV
    for bad in (0, True, "x"):
        with pytest.raises(InputError):
            threads.codec_threads(bad)


def test_launch_env_gives_each_started_rank_its_share(clean_env):
    share = max(1, threads.host_cores() // 2)
    assert threads.launch_env(None, 2) == {threads.ENV: str(share), "NUMBA_NUM_THREADS": str(share),
                                           "OMP_NUM_THREADS": str(share)}
    assert threads.launch_env(3, 2)[threads.ENV] == "3"
    assert threads.launch_env(None, 4, cores=16)["NUMBA_NUM_THREADS"] == "4"


def test_apply_sets_numba_per_thread_and_keeps_a_users_numba_setting(clean_env):
    from realrun.compressors import fast

    if not fast.AVAILABLE:
        pytest.skip("numba is not installed")
    import numba

    def in_thread(fn):
        box = []
        t = threading.Thread(target=lambda: box.append(fn()))
        t.start()
        t.join()
        return box[0]

    assert in_thread(lambda: (threads.apply(1), numba.get_num_threads())) == (1, 1)
    expected = min(threads.codec_threads(), numba.config.NUMBA_NUM_THREADS)
    assert in_thread(lambda: (threads.apply(), numba.get_num_threads())) == (expected, expected)
    clean_env.setenv("NUMBA_NUM_THREADS", str(numba.config.NUMBA_NUM_THREADS))   # the user's own setting
    assert in_thread(lambda: (threads.apply(), numba.get_num_threads())) == (None, numba.config.NUMBA_NUM_THREADS)
    clean_env.setenv(threads.ENV, "1")                     # realrun's variable is explicit: it applies
    assert in_thread(lambda: (threads.apply(), numba.get_num_threads())) == (1, 1)


def test_hook_and_comm_take_a_thread_count():
    torch = pytest.importorskip("torch")  # noqa: F841
    from realrun.comm import Comm
    from realrun.hooks import compression_hook

    assert Comm(threads=2).threads == 2 and Comm().threads is None
    state, _ = compression_hook("int8", threads=1)
    assert state.threads == 1 and state.comm.threads == 1
    with pytest.raises(InputError):
        compression_hook("int8", threads=0)
