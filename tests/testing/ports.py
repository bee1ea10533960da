"""A free TCP port on this machine, for the rendezvous of process groups that tests spawn."""

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
