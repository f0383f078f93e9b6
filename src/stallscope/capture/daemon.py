"""A sampler's daemon thread: started once, stopped once, from any thread (the samplers of
memory.py and loadsampler.py sweep on one each, beside the training thread)."""

from __future__ import annotations

import threading


class DaemonThread:
    """Runs `_run` on a daemon thread named `thread_name` from `start()`; `_run` returns once
    `_stop` is set. Start and stop are idempotent; stop joins for at most two seconds."""

    thread_name = "stallscope-daemon"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    def _run(self) -> None:
        raise NotImplementedError
