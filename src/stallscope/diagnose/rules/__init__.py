"""One module per rule, named by its id (`gpu-idle` is `gpu_idle.py`): its detection, its
thresholds, the change that fixes it and its docs entry (the module's `SPEC`); that change's
replay model is `replay/models/<id>.py`. A rule imports shared helpers from `diagnose/common.py`
(or the trace stage), never from another rule (tests/test_layers.py)."""
