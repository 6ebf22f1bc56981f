"""Fixtures of realrun's tests (the repository's own are in tests/conftest.py)."""
import socket

import pytest


def pick_port() -> int:
    """A TCP port free on loopback now: the rendezvous of ranks a test starts (``launch_ranks``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def free_port():
    return pick_port


def assert_declared_phases(record: dict, model: str = "gpt-tiny", **plan) -> None:
    """A step record of realrun train measures perfmodel's declared phases (perfmodel.axes: the
    compute, compression and optimizer phases and the phase of each axis the plan reports, every
    non-optional axis and the optional ones it carries) under their names, and no other phase."""
    from perfmodel.axes import AXES, PHASES
    from perfmodel.phases import COMPRESSION, COMPUTE, OPTIMIZER
    from perfmodel.workload import load_model

    spec, plan = load_model(model), {"zero": 0, **plan}
    axes = [name for name, axis in AXES.items() if not axis.optional or axis.active(plan, spec)]
    expected = {COMPUTE.name, COMPRESSION.name, OPTIMIZER.name} | {AXES[a].phase.name for a in axes}
    assert {k for k in record if k in {p.name for p in PHASES}} == expected
    assert not {"compress_s", "dp_comm_s"} & set(record)
    assert {k.removesuffix("_wire_bytes") for k in record if k.endswith("_wire_bytes")} == set(axes)


@pytest.fixture
def declared_phases():
    return assert_declared_phases


HF_ENV = dict(GLOO_SOCKET_IFNAME="lo", TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1")
THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "COMMPRESS_CODEC_THREADS", "LOCAL_WORLD_SIZE")


def run_hf_cases(worker: str, cases: list, steps: int, out, run_ranks) -> list:
    """Every case of an HF client worker (``hf_ddp_worker.py``, ``hf_fsdp_worker.py``) in one pair
    of gloo ranks, with no thread variable set (realrun's defaults apply); their summaries."""
    import json
    import os
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS} | HF_ENV
    script = str(Path(__file__).with_name(worker))
    port = pick_port()
    logs = run_ranks([[sys.executable, script, str(r), "2", str(port), json.dumps(cases), str(steps), str(out)]
                      for r in range(2)], 480, env)
    assert "Traceback" not in "".join(logs), "\n".join(f"rank {r}: {log[-2000:]}" for r, log in enumerate(logs))
    return json.loads(Path(out).read_text())


@pytest.fixture(scope="session")
def hf_cases():
    return run_hf_cases
