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
record the same document. Every output a resource class declares is answered,
as a real engine would: the ones `COMPUTED_OUTPUTS` names with the value given
there, every other string output the inputs lack with a placeholder named after
the property (`<publicIp:nat-eip>`), and any other output the inputs lack
as unknown, so that an input built from it shows as `<computed>` in a synth
instead of silently missing (`Recording.unknown_outputs` lists them).

URNs are made as the Pulumi engine makes them (`urn:pulumi:<stack>::<project>::
<parent types $ type>::<name>`, with the root stack left out of the type chain),
not as the SDK's `MockMonitor` does, so they match `pulumi stack --show-urns`
and the aliases a program writes. Stack outputs are recorded resolved (`outputs`),
the way the engine would store them. The runtime's global state is reset after
each run, so runs in one process do not leak into each other.
"""

from __future__ import annotations

import asyncio
import importlib
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pulumi
import pulumi.runtime.resource as runtime_resource
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.proto import source_pb2
from pulumi.runtime.settings import get_project, get_root_resource, get_stack
from pulumi.runtime.stack import Stack, massage

from infra.preview.markers import placeholder

STACK_TYPE = "pulumi:pulumi:Stack"

# Outputs that providers compute and programs read, by resource type. Only what
# this project's code reads needs to be here; anything else read from a mock
# resource would be missing (and unknown), which tests notice.
COMPUTED_OUTPUTS: dict[str, Callable[[str, dict], dict]] = {
    # components/cluster.py reads these to build the kubeconfig and its outputs.
    "aws:eks/cluster:Cluster": lambda name, inputs: {
        "name": inputs.get("name", name),
        "endpoint": f"https://{placeholder('endpoint', name)}",
        "certificateAuthority": {"data": placeholder("ca-data", name)},
        "vpcConfig": {"clusterSecurityGroupId": placeholder("cluster-sg", name)},
        "identities": [{"oidcs": [{"issuer": f"https://{placeholder('oidc', name)}"}]}],
        # components/stack.py derives the API server's ClusterIP from it (the operators' NetworkPolicies);
        # a stand-in: EKS assigns 10.100.0.0/16 or 172.20.0.0/16 when the cluster names none (botocore eks,
        # KubernetesNetworkConfigRequest.serviceIpv4Cidr).
        "kubernetesNetworkConfig": {"ipFamily": "ipv4", "serviceIpv4Cidr": "172.20.0.0/16"},
    },
    # components/network.py exports the placement group's (auto-generated) name.
    "aws:ec2/placementGroup:PlacementGroup": lambda name, inputs: {"name": inputs.get("name", name)},
    "aws:iam/role:Role": lambda name, inputs: {"name": inputs.get("name", name)},
    "aws:kms/key:Key": lambda name, inputs: {"keyId": placeholder("key-id", name)},
    # components/gpu_nodes.py pins the node group to the template's latest version
    # (a new template starts at version 1); without it synth would show no version.
    "aws:ec2/launchTemplate:LaunchTemplate": lambda name, inputs: {"latestVersion": 1},
    # components/stack.py builds the serving image's reference from it.
    "aws:ecr/repository:Repository": lambda name, inputs: {
        "repositoryUrl": f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{inputs.get('name', name)}"
    },
    # components/storage.py puts these in the weights' PersistentVolume.
    "aws:efs/mountTarget:MountTarget": lambda name, inputs: {"ipAddress": "10.0.128.10"},
    "aws:fsx/lustreFileSystem:LustreFileSystem": lambda name, inputs: {
        "dnsName": f"{placeholder('fsx', name)}.fsx.amazonaws.com",
        "mountName": "abcdefgh",
    },
    # components/gpu_nodes.py exports the node group's name (the engine derives it from the resource name).
    "aws:eks/nodeGroup:NodeGroup": lambda name, inputs: {"nodeGroupName": inputs.get("nodeGroupName", name)},
    # components/network.py hands the NAT gateways their elastic IPs' allocation ids.
    "aws:ec2/eip:Eip": lambda name, inputs: {"allocationId": placeholder("allocation-id", name)},
}


def _output_properties(typ: str) -> dict[str, bool]:
    """The outputs a resource class declares: engine name -> whether it is a string."""
    cached = _OUTPUTS.get(typ)
    if cached is not None:
        return cached
    found: dict[str, bool] = {}
    cls = _resource_class(typ)
    for klass in reversed(getattr(cls, "__mro__", ())):
        for attr in vars(klass).values():
            getter = getattr(attr, "fget", None) if isinstance(attr, property) else None
            engine_name = getattr(getter, "_pulumi_name", None)
            if not engine_name:
                continue
            args = typing.get_args(getter.__annotations__.get("return"))
            inner = [a for a in typing.get_args(args[0]) or args if a is not type(None)] if args else []
            found[engine_name] = inner == [str]
    _OUTPUTS[typ] = found
    return found


def sdk_class_path(typ: str) -> Optional[str]:
    """The SDK class of a resource type token, as the SDK itself finds it: `aws:ec2/eip:Eip` ->
    `pulumi_aws.ec2.Eip`, `kubernetes:networking.k8s.io/v1:NetworkPolicy` -> `pulumi_kubernetes.networking.v1.NetworkPolicy`.

    A generated Pulumi package registers its modules when it is imported (its
    `_utilities.register`: each module's Python name and the class of each type
    token in it), and the SDK looks them up to rebuild a resource from a
    reference (`pulumi.runtime.rpc.get_resource_module`). None for a token no
    imported package registers: a component, a custom resource (`kubernetes:ray.io/v1:RayCluster`).
    """
    pkg, _, rest = typ.partition(":")
    module = rpc.get_resource_module(pkg, rest.rpartition(":")[0], "")
    info = getattr(module, "mod_info", None) or {}
    name = (info.get("classes") or {}).get(typ)
    return f"{info['fqn']}.{name}" if name else None


def _resource_class(typ: str):
    path = sdk_class_path(typ)
    if path is None:
        return None
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


_OUTPUTS: dict[str, dict[str, bool]] = {}


def _computed(typ: str, name: str, inputs: dict) -> dict:
    out = {"arn": placeholder("arn", name), "id": placeholder("id", name)}
    extra = COMPUTED_OUTPUTS.get(typ)
    if extra:
        out.update(extra(name, inputs))
    return out


def _declared(typ: str, name: str, state: dict, unknown: list[tuple[str, str, str]]) -> dict:
    """Answer every declared output `state` lacks: strings with a placeholder, anything else as unknown."""
    for prop, is_str in _output_properties(typ).items():
        if prop in state:
            continue
        if is_str:
            state[prop] = placeholder(prop, name)
        else:
            state[prop] = rpc.UNKNOWN
            unknown.append((typ, name, prop))
    return state


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
    exports: dict[str, Any] = field(default_factory=dict)  # as passed to pulumi.export (may hold Outputs)
    # (type, name, output) of declared outputs answered as unknown: nothing computes them here.
    unknown_outputs: list[tuple[str, str, str]] = field(default_factory=list)
    # The stack outputs as the engine would receive them when the program ends:
    # Outputs resolved, secrets wrapped as rpc secrets (`rpc.is_rpc_secret`),
    # unknown values as `pulumi.output.Unknown`.
    outputs: dict[str, Any] = field(default_factory=dict)

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
    # The serving image bin/build-image pushed, by the digest its tag holds (components/stack.py): one
    # stable placeholder digest, so a preview diff never shows the image changing by itself.
    "aws:ecr/getImage:getImage": lambda a: {
        "imageDigest": "sha256:" + "0" * 64,
        "imageTags": [a.get("imageTag", "")],
        "repositoryName": a.get("repositoryName", ""),
        "id": "sha256:" + "0" * 64,
    },
    # A stack that has never existed: no log group kept from an earlier life (components/protection.py adopt).
    "aws:cloudwatch/getLogGroups:getLogGroups": lambda a: {"arns": [], "logGroupNames": [], "id": "us-east-1"},
}


def _fill(state: dict, computed: dict) -> dict:
    """Add computed values the inputs lack, inside nested objects too (vpcConfig.clusterSecurityGroupId)."""
    for key, value in computed.items():
        if key not in state:
            state[key] = value
        elif isinstance(state[key], dict) and isinstance(value, dict):
            state[key] = _fill(dict(state[key]), value)
    return state


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self, recording: Recording) -> None:
        self.recording = recording

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = _fill(dict(args.inputs), _computed(args.typ, args.name, args.inputs))
        return placeholder("id", args.name), _declared(args.typ, args.name, state, self.recording.unknown_outputs)

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.recording.calls.append((args.token, dict(args.args)))
        answer = CALL_RESULTS.get(args.token)
        return answer(dict(args.args)) if answer else {}


def engine_urn(stack: str, project: str, parent: str, type_: str, name: str) -> str:
    """The URN the Pulumi engine gives a resource (`resource.NewURN`).

    The type part is the parent's qualified type chain joined with `$`, leaving
    out the root stack: a top-level VPC is `...::aws:ec2/vpc:Vpc::vpc`, a VPC in a
    component `...::gpu-serving:network:Network$aws:ec2/vpc:Vpc::vpc`.
    """
    if parent:
        parent_type = parent.split("::")[2]
        if parent_type != STACK_TYPE:
            type_ = f"{parent_type}${type_}"
    return f"urn:pulumi:{stack}::{project}::{type_}::{name}"


def _alias_urns(request) -> list[str]:
    """Aliases as URNs: alias specs are completed from the resource as the engine does."""
    urns = set(request.aliasURNs)
    for alias in request.aliases:
        if alias.WhichOneof("alias") == "urn":
            urns.add(alias.urn)
            continue
        spec = alias.spec
        if spec.noParent:
            parent = ""
        elif spec.WhichOneof("parent") == "parentUrn" and spec.parentUrn:
            parent = spec.parentUrn
        else:
            parent = request.parent
        urns.add(
            engine_urn(
                spec.stack or get_stack(),
                spec.project or get_project(),
                parent,
                spec.type or request.type,
                spec.name or request.name,
            )
        )
    return sorted(urns)


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
        "aliases": _alias_urns(request),
        "custom_timeouts": {k: v for k, v in (("create", timeouts.create), ("update", timeouts.update), ("delete", timeouts.delete)) if v},
        **({"import": request.importId} if request.importId else {}),  # adopt an existing resource by its id
    }


def _ensure_event_loop() -> None:
    # Monitor calls run on executor threads; deserialising may need a loop there.
    try:
        asyncio.get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())


class _RecordingMonitor(MockMonitor):
    def __init__(self, mocks: _Mocks, recording: Recording) -> None:
        super().__init__(mocks)
        self.recording = recording

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        # MockMonitor keeps the root stack in the type chain and only the parent's
        # last type; the engine does neither.
        return engine_urn(get_stack(), get_project(), parent, type_, name)


    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)
        inputs = {}
        if request.type != STACK_TYPE:
            _ensure_event_loop()
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


def no_stack_trace() -> source_pb2.StackTrace:
    """What the recording engine gets in place of each registration's call stack.

    The SDK walks the whole Python stack for every resource it registers (pulumi 3.272.0
    pulumi/runtime/resource.py `_get_stack_trace`: traceback.extract_stack, a file URI and a
    protobuf frame per frame), for the source positions the Pulumi service shows; the recording
    engine records none of them (neither `stackTrace` nor `sourcePosition` of a request), and the
    walk was 40 s of CPU in a run of the tests' 250 syntheses. An empty trace is what the SDK
    sends when it finds no caller (and `_get_source_position` then gives None)."""
    return source_pb2.StackTrace()


def record(
    program: Callable[[], None],
    *,
    project: str = "gpu-serving",
    stack: str = "prod",
    config: dict[str, str] | None = None,
    into: Recording | None = None,
) -> Recording:
    """Run `program` under the recording engine and return what it declared.

    `config` is the stack config as the Pulumi CLI hands it to a program
    (`infra.config.engine_config`). Exports are recorded too: as given
    (`exports`) and resolved as the engine would store them (`outputs`). The
    runtime's global state (settings, root stack, config) is reset afterwards,
    whether the program succeeded or raised; pass `into` to keep what was
    recorded when the program raises.
    """
    recording = into if into is not None else Recording()
    real_export = pulumi.export

    def recording_export(name: str, value: Any) -> None:
        recording.exports[name] = value
        real_export(name, value)

    pulumi.runtime.reset_options(project=project, stack=stack, preview=False)
    pulumi.runtime.set_all_config(dict(config or {}))
    mocks = _Mocks(recording)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=_RecordingMonitor(mocks, recording))
    pulumi.export = recording_export

    def run():
        program()
        # set_mocks finished the root stack before the program ran, so its
        # exports never reach the engine. Resolve them here, inside the run, the
        # way the language host sends them when a program ends (massage, then
        # serialise: Outputs awaited, secrets marked, unknowns kept).
        root = get_root_resource()
        if not (isinstance(root, Stack) and root.outputs):
            return None

        async def resolve_outputs() -> None:
            struct = await rpc.serialize_properties(massage(root.outputs, []), {})
            recording.outputs = rpc.deserialize_properties(struct, keep_unknowns=True)

        return resolve_outputs()  # awaited by pulumi.runtime.test

    stack_trace = runtime_resource._get_stack_trace
    runtime_resource._get_stack_trace = no_stack_trace
    try:
        pulumi.runtime.test(run)()
    finally:
        runtime_resource._get_stack_trace = stack_trace
        pulumi.export = real_export
        pulumi.runtime.set_all_config({})
        pulumi.runtime.reset_options()
    return recording
