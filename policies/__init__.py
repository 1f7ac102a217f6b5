"""The CrossGuard policy pack of the GPU serving stack (`pulumi preview --policy-pack policies`).

`rules.py` holds the rules as plain functions (no Pulumi import); `__main__.py`
wires them into pulumi-policy. `infra/preview/policy_check.py` runs the same rules over
an offline synth document (`python -m infra check --stack prod`).
"""
