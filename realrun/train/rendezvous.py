"""The store a launched run's ranks meet in, one of its own for every torchrun attempt.

torchrun hands its ranks the elastic agent's TCPStore (``TORCHELASTIC_USE_AGENT_STORE=True``,
``MASTER_ADDR:MASTER_PORT``) and keeps that one store across the restarts of ``--max-restarts``,
with the keys a failed attempt wrote still in it: gloo's addresses of the ranks (dead ones
among them) and every group's counters. A restarted rank reading a key before its peer has
rewritten it connects to a dead rank's port (``Connection refused``) or waits on a peer that is
not there. So each attempt meets in an empty store: rank 0 starts a TCPStore on a free port and
announces it (address, port, a fresh token) in the agent's store; every other rank connects to
the announced store and takes it once it holds that token. An announcement left by a failed
attempt names a store whose rank 0 is gone (torchrun stops every rank before it starts the next
attempt), so a rank reading it retries until the new one is there. Every wait is bounded by
``timeout_s``.
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import timedelta

import torch.distributed as dist

ANNOUNCE_KEY = "realrun/attempt-store"   # in the agent's store: "ADDRESS PORT TOKEN" of this attempt's store
TOKEN_KEY = "realrun/token"              # in an attempt's own store: its TOKEN
RETRY_S = 0.05                           # between looks at a stale announcement
CONNECT_S = 5.0                          # a connection to an announced store (its rank 0 is up when announced)


def init_process_group(backend: str, rank: int, world: int, timeout_s: float, file_store: str | None = None) -> None:
    """torch.distributed's default group of this rank: on ``file_store`` (a FileStore path, the
    ranks ``run_local`` starts), in a store of this attempt's own under torchrun's shared store,
    else env:// (``realrun cluster run``; rank 0 hosts a new store at MASTER_PORT each time)."""
    timeout = timedelta(seconds=timeout_s)
    if file_store is None and shares_agent_store():
        dist.init_process_group(backend, store=attempt_store(rank, timeout_s), rank=rank, world_size=world,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout,
                                init_method="env://" if file_store is None else f"file://{file_store}")


def shares_agent_store() -> bool:
    """A rank of torchrun whose agent hosts the store at MASTER_ADDR:MASTER_PORT for every attempt."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def attempt_store(rank: int, timeout_s: float) -> dist.Store:
    """This attempt's own empty store (call under ``shares_agent_store()``; every rank of the
    attempt calls it): rank 0 hosts it, the others find it through the agent's store."""
    timeout = timedelta(seconds=timeout_s)
    address = os.environ["MASTER_ADDR"]
    agent = dist.TCPStore(address, int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    if rank == 0:
        return _host(agent, address, timeout)
    return _join(agent, time.monotonic() + timeout_s, timeout)


def _host(agent: dist.Store, address: str, timeout: timedelta) -> dist.Store:
    own = dist.TCPStore(address, 0, is_master=True, wait_for_workers=False, timeout=timeout)
    token = uuid.uuid4().hex
    own.set(TOKEN_KEY, token)
    agent.set(ANNOUNCE_KEY, f"{address} {own.port} {token}")
    return own


def _join(agent: dist.Store, deadline: float, timeout: timedelta) -> dist.Store:
    while True:
        address, port, token = agent.get(ANNOUNCE_KEY).decode().split()   # waits for the first announcement
        own = _connect(address, int(port), token, deadline)
        if own is not None:
            own.set_timeout(timeout)
            return own
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0's store of this attempt not announced within {timeout.total_seconds():g} s "
                               f"(the last announcement: {address}:{port}, gone)")
        time.sleep(RETRY_S)


def _connect(address: str, port: int, token: str, deadline: float) -> dist.Store | None:
    """The store at ``address:port`` if it is up and holds ``token``; None otherwise (a failed
    attempt's store: gone, or its port taken since by another listener)."""
    wait_s = max(0.1, min(CONNECT_S, deadline - time.monotonic()))
    try:
        socket.create_connection((address, port), timeout=wait_s).close()   # refused at once when gone
        own = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=wait_s))
        if own.check([TOKEN_KEY]) and own.get(TOKEN_KEY).decode() == token:
            return own
    except (OSError, RuntimeError):   # DistStoreError, DistNetworkError are RuntimeErrors
        pass
    return None
