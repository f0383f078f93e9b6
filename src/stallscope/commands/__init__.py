"""Commands: one module per subcommand (analyze, run, compare, tune), each owning its parser and
its `main`; `common` holds what they share and `pipeline` the analysis they all end in."""
