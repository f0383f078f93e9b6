"""The replay model of each `--what-if` change: what the change does to the recorded graph.

Each change's model lives in the module named after the rule whose change it is
(`dataloader_bound.py` holds `num_workers`, `host_device_sync.py` holds `sync`): the first rule
in diagnose/registry.py's order that declares the key. A model module's `MODELS` maps its keys
to their `Model`s (common.py); diagnose/fixes.py finds a key's model through the registry, and
tests/test_registry.py checks every declared key has one where its rule's name says.
"""
