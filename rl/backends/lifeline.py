"""Actors that end with the run: a Ray actor process whose parent (the raylet that started it) is gone, because the
launcher was killed with its whole process group, exits at once instead of after Ray notices on its own."""

from __future__ import annotations

import os
import threading
import time

POLL_S = 0.2


def exit_with_parent() -> None:
    """Starts a daemon thread that ends this process when its parent process changes (the parent died and the
    process was handed to another). Idempotent."""
    global _started
    if _started:
        return
    _started = True
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(POLL_S)
            if os.getppid() != parent:
                os._exit(1)  # no cleanup to wait for: the run is gone

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


_started = False
