"""Callbacks that profile a framework's training loop: `stallscope.integrations.lightning` and
`stallscope.integrations.transformers`. Each imports its framework only when it is imported
itself, so stallscope never needs either installed."""
