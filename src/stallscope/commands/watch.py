"""`stallscope watch`: run a training script to its end, time every step, and report where and
when the run stalls, with the diagnosis of the steps recorded under the profiler.

`run` profiles a few steps near the start; real runs stall later (a cold page cache after the
first epoch, workers restarted each epoch, a checkpoint every N steps). `watch` is `run` with
the script let finish and every step boundary logged (capture/steplog.py: wall time, DataLoader
wait, epoch), live as TensorBoard scalars, then the whole series analysed (stallscope/wholerun/).
The launch contract, the recorded window and the report are `run`'s (commands/run.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from stallscope.commands import COMMANDS
from stallscope.commands.common import seconds, whole_number

NAME = "watch"
TAKES_SCRIPT = True  # everything after SCRIPT (or -m MODULE) is the script's


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from stallscope.commands.run import add_capture_arguments

    watch = sub.add_parser(
        NAME,
        help=COMMANDS[NAME],
        usage="stallscope watch [OPTIONS] (SCRIPT | -m MODULE) [ARGS...]",
        description="Run an unmodified training script to its end (as `python SCRIPT ARGS` "
        "would), time every training step (wall time, DataLoader wait, epoch) into "
        "OUT/watch/steps.jsonl and TensorBoard scalars as it runs, record a few steps under "
        "torch.profiler once the run is steady, and report the whole run's step times beside "
        "the diagnosis of the recorded steps. --timeout bounds the run's duration.",
    )
    add_capture_arguments(watch)
    watch.add_argument("--max-steps", type=whole_number(1), metavar="N",
                       help="stop the script once N steps have been watched, the report "
                       "covering them (exit 0)")
    watch.add_argument("--duration", type=seconds, metavar="SECONDS",
                       help="stop the script at the first step boundary after it has run "
                       "SECONDS, the report covering the steps watched (exit 0); --timeout "
                       "stops a script at that time wherever it is, and exits 124")
    watch.set_defaults(watch=True, run_to_end=True)
    return watch


def main(args: argparse.Namespace, script_args: list[str], command: list[str]) -> int:
    from stallscope.commands import run

    return run.main(args, script_args, command)
