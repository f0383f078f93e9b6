"""One module per rule, named by its id (`gpu-idle` is `gpu_idle.py`): its detection, its
thresholds, the change that fixes it, compare's quantity, its causes and flags, and its docs
entry (the module's `SPEC`, diagnose/spec.py); diagnose/registry.py finds every module here,
so a new rule is a new module. That change's replay model is `replay/models/<id>.py`. A rule
imports shared helpers from `diagnose/common.py` (or the trace stage), never from another rule
(tests/test_layers.py)."""
