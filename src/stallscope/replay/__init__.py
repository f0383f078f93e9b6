"""Replay: each recorded step as a dependency graph (`graph`), replayed as recorded and with a
fix applied (`engine`; each change's model in `models/`, named after its rule), to predict the
step time a user will measure after a change."""
