"""One module per rule, named by its id (`gpu-idle` is `gpu_idle.py`): its detection, its
thresholds, the change that fixes it and its docs entry (the module's `SPEC`). A rule imports
shared helpers from `diagnose/common.py`, never from another rule (tests/test_layers.py)."""
