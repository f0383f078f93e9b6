"""What `run` saw of a script that ended or crashed before any step was recorded.

Without a recorded step there is nothing to diagnose, but the run was not empty: the steps
timed without the profiler, the DataLoaders built, how the script ended. An empty folder and
one error line lose all of it, and leave the user guessing which flags would have recorded the
steps the script does run. This writes `report.md` (what was seen, and the exact command) and
`run.json` (the run's facts, as `stallscope run` keeps them for a report), and gives the
command for the error line.
"""

from __future__ import annotations

import json
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

from stallscope.outputs import write_files
from stallscope.report.md_text import bullets, code, command_lines, paragraph, prose
from stallscope.runfacts import RunContext
from stallscope.text import md_code, plural
from stallscope.units import ms

# Run-level options of `stallscope run` that choose the window; replaced in the command given.
WINDOW_FLAGS = ("--skip", "--warmup", "--steps")
WINDOW_SWITCHES = ("--no-steady-wait",)


@dataclass(frozen=True)
class Window:
    """Flags that record steps the script ran. The profiler starts at step boundary `skip + 1`
    (the step before the first boundary holds the script's start-up, so `--skip 0` already
    leaves it out), and each warm-up and recorded step ends at a boundary of its own: the
    window fits when `skip + 1 + warmup + steps <= boundaries seen`."""

    skip: int
    warmup: int
    steps: int

    @classmethod
    def fitting(cls, boundaries: int, wanted: int) -> Window | None:
        """The widest window inside `boundaries` step boundaries, warming up one step when
        there are steps to spare; None when fewer than two boundaries passed (no step ran
        whole after the start-up)."""
        usable = boundaries - 1
        if usable < 1:
            return None
        warmup = 1 if usable >= 2 else 0
        return cls(0, warmup, min(wanted, usable - warmup))


def rerun_command(command: list[str], script_words: int, window: Window) -> str:
    """`command` (as typed, the script and its arguments last: `script_words` words) with the
    window flags replaced by `window`'s, the wait for steady steps turned off and `--force`,
    shell-quoted."""
    head, tail = command[:len(command) - script_words], command[len(command) - script_words:]
    kept: list[str] = []
    skip_next = False
    for word in head:
        if skip_next:
            skip_next = False
            continue
        name = word.split("=", 1)[0]
        if name in WINDOW_FLAGS:
            skip_next = "=" not in word
            continue
        if word in WINDOW_SWITCHES:
            continue
        kept.append(word)
    end = len(kept)  # before `-m` (MODULE follows) and a `--` that ends the options
    while end > 0 and kept[end - 1] in ("-m", "--"):
        end -= 1
    flags = ["--skip", str(window.skip), "--warmup", str(window.warmup), "--steps",
             str(window.steps), "--no-steady-wait"]
    if "--force" not in kept:  # it replaces the report.md written here, nothing of the user's
        flags.append("--force")
    return shlex.join([*kept[:end], *flags, *kept[end:], *tail])


def write(out: Path, ctx: RunContext, how: str, command: str | None) -> None:
    """report.md and run.json in `out`. `how` is the clause after "The script" saying how it
    ended; `command` the one that records the steps it ran, or None. report.md is written as
    report/markdown.py writes its own (md_text.py): lists, code spans, wrapped lines."""
    lines = ["# stallscope: no step recorded", ""]
    lines += paragraph(f"The script {code(ctx.target)} {prose(how)} after "
                       f"{plural(ctx.boundaries_seen, 'step')}, before the profiler recorded "
                       "one.")
    if command:
        lines += paragraph("To record the steps it does run, with the profiler started from the "
                           "second step (recorded steps may hold start-up costs that a longer "
                           "run would not):")
        lines += ["```sh", md_code(command_lines(command)), "```", ""]
    else:
        lines += paragraph("No step ended before the script did: no window can record one. Fix "
                           "what ended it, or let it run longer, then run stallscope again.")
    times = ctx.unprofiled_steps_us
    if times:
        lines += ["## The steps timed without the profiler", ""]
        lines += paragraph(f"Median {ms(statistics.median(times), 'tenths')} ms over "
                           f"{plural(len(times), 'step')} (from the second step boundary on; the "
                           "first holds the script's start-up). Measured, not predicted.")
        lines += [*bullets([f"step {i + 2}: {ms(t, 'tenths')} ms"
                            for i, t in enumerate(times)]), ""]
    if ctx.dataloaders:
        lines += ["## DataLoaders the script built", ""]
        lines += bullets([
            f"{code(d.call_site)}: {code(d.dataset)}, {code('batch_size')} {d.batch_size}, "
            f"{code('num_workers')} {d.num_workers}, {code('pin_memory')} {d.pin_memory}; "
            f"{plural(d.batches, 'batch', 'batches')} drawn" for d in ctx.dataloaders])
        lines.append("")
    if ctx.notes:
        lines += ["## Notes", "", *bullets([prose(n) for n in ctx.notes]), ""]
    write_files(out, {
        "report.md": "\n".join(lines).rstrip() + "\n",
        "run.json": json.dumps(ctx.to_dict(), indent=1, sort_keys=True) + "\n",
    })
