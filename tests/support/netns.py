"""Machines on one host for the slow tier: network namespaces (``ip netns``, root only), each with its own
addresses, as two machines of a cluster or a team have.

``two_hosts``: two namespaces joined by a veth pair (two msrun nodes talking to each other). ``bridged_hosts``:
namespaces on a bridge in the host's own namespace, which they reach at ``<subnet>.1``; ``forwarded`` passes
connections to that address on to a server of this host that listens on loopback only (PostgreSQL, an MLflow
server), as the team's database and tracking servers are reached over the network. Where ``ip netns`` is not
permitted the test is skipped, naming why, except under CI (``CI=true``), where it fails. Everything made is removed
afterwards, also on failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Node:
    namespace: str
    address: str


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _tag() -> str:
    return f"{os.getpid() % 100000}"


def _first_namespace(name: str) -> None:
    """Make the namespace ``name``, or skip (fail under CI) saying why it cannot be made here."""
    if shutil.which("ip") is None:
        reason = "the ip command (Debian package iproute2) is missing"
    else:
        made = ip("netns", "add", name)
        reason = None if made.returncode == 0 else f"ip netns add is not permitted here: {made.stderr.strip()}"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def _run_steps(steps: list[tuple[str, ...]]) -> None:
    for step in steps:
        result = ip(*step)
        assert result.returncode == 0, f"ip {' '.join(step)}: {result.stderr}"


@contextmanager
def two_hosts() -> Iterator[tuple[Node, Node]]:
    """Two namespaces with a veth pair between them and loopback up; removed afterwards, also on failure."""
    tag = _tag()
    subnet = f"10.231.{os.getpid() % 250}"
    nodes = (Node(f"msrun-test{tag}-0", f"{subnet}.1"), Node(f"msrun-test{tag}-1", f"{subnet}.2"))
    _first_namespace(nodes[0].namespace)
    try:
        steps = [
            ("netns", "add", nodes[1].namespace),
            ("link", "add", f"veth{tag}a", "type", "veth", "peer", "name", f"veth{tag}b"),
            ("link", "set", f"veth{tag}a", "netns", nodes[0].namespace),
            ("link", "set", f"veth{tag}b", "netns", nodes[1].namespace),
        ]
        for node, veth in zip(nodes, (f"veth{tag}a", f"veth{tag}b"), strict=True):
            steps += [
                ("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", veth),
                ("-n", node.namespace, "link", "set", veth, "up"),
                ("-n", node.namespace, "link", "set", "lo", "up"),
            ]
        _run_steps(steps)
        yield nodes
    finally:
        for node in nodes:
            ip("netns", "del", node.namespace)  # takes its end of the veth pair with it


@contextmanager
def bridged_hosts(count: int = 2) -> Iterator[tuple[str, list[Node]]]:
    """``count`` namespaces on a new bridge of this host's namespace: yields the host's address on the bridge
    (``<subnet>.1``, which every namespace reaches) and the namespaces (``<subnet>.2``, ``.3``, ...)."""
    tag = _tag()
    subnet = f"10.232.{os.getpid() % 250}"
    bridge = f"br{tag}"
    nodes = [Node(f"machine-test{tag}-{index}", f"{subnet}.{index + 2}") for index in range(count)]
    _first_namespace(nodes[0].namespace)
    try:
        steps = [("netns", "add", node.namespace) for node in nodes[1:]]
        steps += [
            ("link", "add", bridge, "type", "bridge"),
            ("addr", "add", f"{subnet}.1/24", "dev", bridge),
            ("link", "set", bridge, "up"),
        ]
        for index, node in enumerate(nodes):
            host_end, node_end = f"veth{tag}h{index}", f"veth{tag}n{index}"
            steps += [
                ("link", "add", host_end, "type", "veth", "peer", "name", node_end),
                ("link", "set", host_end, "master", bridge),
                ("link", "set", host_end, "up"),
                ("link", "set", node_end, "netns", node.namespace),
                ("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", node_end),
                ("-n", node.namespace, "link", "set", node_end, "up"),
                ("-n", node.namespace, "link", "set", "lo", "up"),
            ]
        _run_steps(steps)
        yield f"{subnet}.1", nodes
    finally:
        for node in nodes:
            ip("netns", "del", node.namespace)  # takes its veth pair with it
        ip("link", "del", bridge)


@contextmanager
def forwarded(address: str, port: int) -> Iterator[str]:
    """Connections to ``address:port`` passed on to ``127.0.0.1:port`` (a server listening on loopback only) while
    the block runs; yields ``address:port``."""
    listener = socket.create_server((address, port))

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was shut down
            upstream = socket.create_connection(("127.0.0.1", port))
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, target), daemon=True).start()

    accepting = threading.Thread(target=accept, daemon=True)
    accepting.start()
    try:
        yield f"{address}:{port}"
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes accept(), which close() alone would not
        listener.close()
        accepting.join(timeout=10)


def _pipe(source: socket.socket, target: socket.socket) -> None:
    """Copy ``source``'s bytes to ``target`` until ``source`` ends, then end ``target``'s sending side."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
