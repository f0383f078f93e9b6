"""Commands: one module per subcommand (analyze, run, compare, tune), each owning its parser and
its `main`; `common` holds what they share and `pipeline` the analysis they all end in."""

# Each command's name and one-line help, in the order `stallscope --help` lists them. The CLI
# imports a command's module only when that command runs (stallscope/cli.py); the modules take
# their `help=` from here, so the listing and the parsers say the same.
COMMANDS: dict[str, str] = {
    "analyze": "diagnose traces recorded elsewhere",
    "run": "profile a training script for a few steps and diagnose it",
    "watch": "run a training script to its end, time every step, and find when it stalls",
    "compare": "compare two reports or traces: step time, breakdown, findings",
    "tune": "measure DataLoader settings on a training script and report the fastest",
}
