"""A TVM RPC tracker seen from a client: is it there, which boards hold a key, and a
session on one of them together with that board's address.

    boards_under("HOST:PORT", "KEY", timeout=30)   -> ["10.0.0.7:9090", ...]  (or TrackerError)
    grant_board(("HOST", PORT), "KEY", wait=...)   -> (board host, port, matchkey)

TVM's own `TrackerSession.request` hides which board it granted and waits for a free
one forever; these bound every wait and say which board answered, so a tuning log can
show where each candidate ran. The protocol is TVM's (tvm.rpc.base): a magic number,
then JSON messages [REQUEST, key, user, priority] -> [SUCCESS, [host, port, matchkey]].
"""

from __future__ import annotations

import socket
import struct

from ..run.deploy import DeployError, bounded, parse_address, probe


class TrackerError(DeployError):
    """The tracker is down or silent, holds no board under the key, or none came free."""


def boards_under(tracker: str, key: str, *, timeout: float) -> list[str]:
    """Addresses of the boards registered at `tracker` under `key` (busy ones included),
    or a TrackerError that lists the keys the tracker does hold."""
    from tvm import rpc
    host, port = parse_address(tracker, what="--rpc-tracker")
    probe(host, port, timeout=timeout, what="RPC tracker")
    session = bounded(lambda: rpc.connect_tracker(host, port), timeout=timeout, what=f"RPC tracker {host}:{port}")
    summary = bounded(session.summary, timeout=timeout, what=f"RPC tracker {host}:{port}")
    session.close()
    servers = summary.get("server_info", [])
    boards = sorted(f"{s['addr'][0]}:{s['addr'][1]}" for s in servers if s.get("key") == f"server:{key}")
    if not boards:
        keys = sorted({s.get("key", "").partition(":")[2] for s in servers})
        raise TrackerError(f"no board registered with key {key!r} at tracker {host}:{port}; registered keys: "
                           f"{', '.join(keys) or 'none'} (start one with `python -m tvm.exec.rpc_server "
                           f"--tracker {host}:{port} --key {key}`)")
    return boards


def grant_board(tracker: tuple[str, int], key: str, *, wait: float, priority: int = 1) -> tuple[str, int, str]:
    """(host, port, matchkey) of the next board under `key` the tracker grants; waits at
    most `wait` s for the tracker and for a board to come free. Connect with
    `tvm.rpc.connect(host, port, matchkey, session_timeout=...)`."""
    from tvm.rpc import base
    where = f"{tracker[0]}:{tracker[1]}"
    try:
        sock = socket.create_connection(tracker, timeout=wait)
    except OSError as err:
        raise TrackerError(f"RPC tracker {where} cannot be reached: {err.strerror or err}") from None
    try:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
            raise TrackerError(f"{where} is not a TVM RPC tracker")
        base.sendjson(sock, [base.TrackerCode.REQUEST, key, "", priority])
        answer = base.recvjson(sock)  # the tracker answers when a board under `key` is free
    except socket.timeout:
        raise TrackerError(f"no board under key {key!r} came free at tracker {where} within {wait:g} s") from None
    except (OSError, struct.error) as err:  # recvall raises IOError when the tracker goes away
        raise TrackerError(f"RPC tracker {where} closed the connection ({err})") from None
    finally:
        sock.close()
    if not isinstance(answer, list) or answer[0] != base.TrackerCode.SUCCESS:
        raise TrackerError(f"RPC tracker {where} refused the request for {key!r}: {answer}")
    host, port, matchkey = answer[1]
    return host, int(port), matchkey
