"""Where the rank processes of one local run meet, on the loopback address only.

torch's TCPStore server, given only a port, listens on every interface (`::` /
`0.0.0.0`), which would expose the run's key-value store to the network. Instead the
launching process serves the store itself (`serve_store`) on a socket it bound to
127.0.0.1 (TCPStore's `master_listen_fd`), on a free port the kernel picks (so there is
no port race either); the ranks join it as clients (`join_group`). Gloo's own listening
sockets follow the device gloo picks for this host's name, which may resolve to an
external address, so ranks pin gloo to the loopback interface (GLOO_SOCKET_IFNAME)
unless the user set it. Every rank runs on this host (kernels.launch, kernels.calibrate),
so nothing needs another address. NCCL's bootstrap sockets are NCCL's (NCCL_SOCKET_IFNAME).
Units: seconds.
"""
from __future__ import annotations

import datetime
import os
import socket
from typing import Any

import torch
import torch.distributed as dist

LOOPBACK = "127.0.0.1"
_IFF_LOOPBACK = 0x8  # linux/if.h
# TCPStore's libuv server takes over a listening socket since torch 2.8 (pytorch#150215);
# before that only the classic server does.
_LIBUV_TAKES_SOCKET = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 8)


def serve_store(timeout_s: float) -> Any:
    """A TCPStore server in this process, listening on 127.0.0.1 only; its port is
    `.port`. It stops when the object is garbage-collected."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((LOOPBACK, 0))
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    fd = listener.detach()  # the store owns (and closes) the socket from here
    return dist.TCPStore(LOOPBACK, 0, None, True, _delta(timeout_s), wait_for_workers=False,
                         master_listen_fd=fd, use_libuv=_LIBUV_TAKES_SOCKET)


def join_group(backend: str, rank: int, world_size: int, port: int, timeout_s: float) -> None:
    """In a rank process: init_process_group over the launcher's loopback store."""
    if backend == "gloo" and not os.environ.get("GLOO_SOCKET_IFNAME"):
        interface = loopback_interface()
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    store = dist.TCPStore(LOOPBACK, port, None, False, _delta(timeout_s))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=_delta(timeout_s))


def loopback_interface() -> str | None:
    """This host's loopback interface name ('lo' on Linux, 'lo0' on macOS), or None."""
    try:
        for name in sorted(os.listdir("/sys/class/net")):
            with open(f"/sys/class/net/{name}/flags") as flags:
                if int(flags.read(), 16) & _IFF_LOOPBACK:
                    return name
    except (OSError, ValueError):
        pass
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def _delta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)
