"""Run Pulumi code against a recording engine instead of a cloud.

`record(program, ...)` runs `program` (a callable that declares resources, e.g.
the whole `__main__.py` or one component) under `pulumi.runtime.set_mocks` with
`preview=False`, and returns every resource registration the engine saw: type,
name, parent, inputs (as the provider would receive them) and the resource
options (protect, dependencies, ignore_changes, retain_on_delete, ...), which
the mocks' `new_resource` alone never sees. The offline `synth` command and the
tests both use it.

Values only the cloud knows (ids, ARNs, endpoints) are answered with stable
placeholders derived from the resource's name, so two runs of the same program
record the same document.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

import pulumi
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor

STACK_TYPE = "pulumi:pulumi:Stack"

# Outputs that providers compute and programs read, by resource type. Only what
# this project's code reads needs to be here; anything else read from a mock
# resource would be missing (and unknown), which tests notice.
COMPUTED_OUTPUTS: dict[str, Callable[[str, dict], dict]] = {}


def placeholder(kind: str, name: str) -> str:
    return f"<{kind}:{name}>"


def _computed(typ: str, name: str, inputs: dict) -> dict:
    out = {"arn": placeholder("arn", name), "id": placeholder("id", name)}
    extra = COMPUTED_OUTPUTS.get(typ)
    if extra:
        out.update(extra(name, inputs))
    return out


@dataclass
class RecordedResource:
    type: str
    name: str
    urn: str
    parent: str  # parent URN ("" for the stack itself)
    custom: bool
    inputs: dict[str, Any]
    options: dict[str, Any]


@dataclass
class Recording:
    resources: list[RecordedResource] = field(default_factory=list)
    calls: list[tuple[str, dict]] = field(default_factory=list)  # invokes: token, args
    exports: dict[str, Any] = field(default_factory=dict)

    def of_type(self, typ: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == typ]

    def one(self, typ: str) -> RecordedResource:
        found = self.of_type(typ)
        if len(found) != 1:
            raise AssertionError(f"expected one {typ}, found {len(found)}: {[r.name for r in found]}")
        return found[0]

    def named(self, name: str) -> RecordedResource:
        found = [r for r in self.resources if r.name == name]
        if len(found) != 1:
            raise AssertionError(f"expected one resource named {name!r}, found {len(found)}")
        return found[0]


# Invokes the project's code makes, answered with stable placeholder data.
CALL_RESULTS: dict[str, Callable[[dict], dict]] = {
    "aws:index/getCallerIdentity:getCallerIdentity": lambda a: {
        "accountId": "123456789012",
        "arn": "arn:aws:iam::123456789012:user/synth",
        "userId": "SYNTH",
        "id": "123456789012",
    },
    "aws:index/getPartition:getPartition": lambda a: {"partition": "aws", "dnsSuffix": "amazonaws.com", "id": "aws"},
    "aws:index/getRegion:getRegion": lambda a: {"name": "us-east-1", "region": "us-east-1", "id": "us-east-1"},
}


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self, recording: Recording) -> None:
        self.recording = recording

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = dict(args.inputs)
        for key, value in _computed(args.typ, args.name, args.inputs).items():
            state.setdefault(key, value)
        return placeholder("id", args.name), state

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.recording.calls.append((args.token, dict(args.args)))
        answer = CALL_RESULTS.get(args.token)
        return answer(dict(args.args)) if answer else {}


def _options(request) -> dict[str, Any]:
    """The resource options carried by a RegisterResource request."""
    timeouts = request.customTimeouts
    return {
        "protect": bool(request.protect),
        "retain_on_delete": bool(request.retainOnDelete),
        "delete_before_replace": bool(request.deleteBeforeReplace),
        "ignore_changes": sorted(request.ignoreChanges),
        "replace_on_changes": sorted(request.replaceOnChanges),
        "depends_on": sorted(request.dependencies),
        # A provider reference is "<provider URN>::<provider id>": keep the provider's name.
        "provider": request.provider.rsplit("::", 1)[0].rsplit("::", 1)[-1] if request.provider else "",
        "additional_secret_outputs": sorted(request.additionalSecretOutputs),
        "aliases": sorted(a for a in request.aliasURNs),
        "custom_timeouts": {k: v for k, v in (("create", timeouts.create), ("update", timeouts.update), ("delete", timeouts.delete)) if v},
    }


class _RecordingMonitor(MockMonitor):
    def __init__(self, mocks: _Mocks, recording: Recording) -> None:
        super().__init__(mocks)
        self.recording = recording

    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)
        inputs = {}
        if request.type != STACK_TYPE:
            try:
                asyncio.get_event_loop()
            except RuntimeError:
                asyncio.set_event_loop(asyncio.new_event_loop())
            inputs = rpc.deserialize_properties(request.object, keep_unknowns=True)
        self.recording.resources.append(
            RecordedResource(
                type=request.type,
                name=request.name,
                urn=response.urn,
                parent=request.parent,
                custom=bool(request.custom),
                inputs=inputs,
                options=_options(request),
            )
        )
        return response


def record(
    program: Callable[[], None],
    *,
    project: str = "gpu-serving",
    stack: str = "prod",
    config: dict[str, str] | None = None,
) -> Recording:
    """Run `program` under the recording engine and return what it declared.

    `config` is the stack config as the Pulumi CLI hands it to a program
    (`infra.config.engine_config`). Exports are recorded too.
    """
    recording = Recording()
    real_export = pulumi.export

    def recording_export(name: str, value: Any) -> None:
        recording.exports[name] = value
        real_export(name, value)

    pulumi.runtime.reset_options(project=project, stack=stack, preview=False)
    pulumi.runtime.set_all_config(dict(config or {}))
    mocks = _Mocks(recording)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=_RecordingMonitor(mocks, recording))
    pulumi.export = recording_export
    try:
        pulumi.runtime.test(program)()
    finally:
        pulumi.export = real_export
        pulumi.runtime.set_all_config({})
    return recording
