"""The profiling window a framework callback drives: `skip` batches pass, then `steps` are
recorded, then the report is written and the training goes on unprofiled.

A framework knows exactly where its batches begin and end, so a callback places the step
boundaries itself (step mode "marker": optimizer steps and DataLoader batches are not counted).
The profiler starts as batch `skip` begins: that batch is the profiler's warm-up step. From
then on a boundary is placed as each batch ends, so each recorded step spans from the end of
one batch to the end of the next: the fetch of its batch (done between the framework's
callbacks), the framework's per-batch hooks, forward, backward and the optimizer, which is
where a hand-written `prof.step()` goes and what `stallscope run` records. The report is written
as the last recorded batch ends, not at the end of training; in watch mode every batch is timed
to the end of training (as `stallscope watch` does), and the report is written then.

A callback must never end the user's training: a window that could not record or analyse
warns (the framework's log shows it) and leaves `report` as None.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from stallscope.api.live import ProfileSession
from stallscope.api.result import Report
from stallscope.errors import EXIT_INTERRUPTED, NoStepsError, StallscopeError


class BatchWindow:
    """One profiling window over a training loop's batches; `report` once it has closed."""

    def __init__(self, steps: int, skip: int, out_dir: str | os.PathLike[str] | None,
                 watch: bool = False) -> None:
        for name, value, least in (("steps", steps, 1), ("skip", skip, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise StallscopeError(f"{name} must be a whole number of at least {least}, "
                                      f"got {value!r}")
        self.steps, self.skip = steps, skip
        self.out_dir = out_dir
        # Watch mode (stallscope.watch): every batch is timed to the end of training, when the
        # report is written with the whole run's series; the recorded window is as before.
        self.watch = watch
        self.report: Report | None = None
        self.session: ProfileSession | None = None
        self._batches = 0  # batches that have ended since `open`

    def open(self, default_out: Path) -> None:
        """Install the hooks before the training loop builds its DataLoaders (their settings
        and call sites go into the report); the profiler starts later, at batch `skip`."""
        if self.session is not None:
            return  # a second fit() with the same callback: the first window is the one
        out = self.out_dir if self.out_dir is not None else default_out
        self.session = ProfileSession(self.steps, skip=0, out_dir=out, warmup=1,
                                      step_on="marker", watch=self.watch).start()

    @property
    def _live(self) -> bool:
        return self.session is not None and not self.session.ended

    def batch_start(self) -> None:
        if self._live and self._batches == self.skip:
            assert self.session is not None
            self.session.step()  # the profiler starts; this batch warms it up

    def batch_end(self) -> None:
        self._batches += 1
        if self._live and self._batches > self.skip:
            assert self.session is not None
            self.session.step()
            if self.session.recording_done and not self.watch:
                self.close()

    def close(self, error: BaseException | None = None) -> None:
        """Stop and analyse (once): at the last recorded batch, at the end of training (a
        partial window), or when training failed with `error`."""
        if not self._live:
            return
        assert self.session is not None
        interrupted = isinstance(error, KeyboardInterrupt)
        ended = "finished" if error is None else "interrupted" if interrupted else "exception"
        status = 0 if error is None else EXIT_INTERRUPTED if interrupted else 1
        try:
            self.report = self.session.stop(ended, status)
        except NoStepsError:
            warnings.warn(
                f"stallscope recorded no step: training ended after {self._batches} batch(es), "
                f"before recording began (skip={self.skip}, then 1 warm-up and {self.steps} "
                "recorded); lower skip or train longer", RuntimeWarning, stacklevel=2)
        except StallscopeError as exc:
            warnings.warn(f"stallscope: {exc}", RuntimeWarning, stacklevel=2)
        except Exception as exc:  # a stallscope bug must not cost the user's training
            warnings.warn(f"stallscope could not analyse the recorded steps: {exc!r}",
                          RuntimeWarning, stacklevel=2)
