"""Offline synthesis: what a stack would create, as one deterministic JSON document.

`synthesize(stack)` runs the real program (`__main__.py`, the way the Python
language host runs it: `runpy.run_path(<project dir>, run_name="__main__")`, with
the project directory as the working directory) in-process under the recording
engine (`infra.recording.record`, `pulumi.runtime.set_mocks` with preview off),
with the stack's own config as the Pulumi CLI would hand it over
(`infra.config.engine_config`). No cloud account, no Pulumi CLI, no state.

The document:

    {
      "project": "gpu-serving",
      "stack": "prod",
      "resources": [            # sorted by URN; the root stack itself is left out
        {
          "type": "aws:eks/nodeGroup:NodeGroup",
          "name": "gpu",
          "urn": "urn:pulumi:prod::gpu-serving::gpu-serving:gpu:GpuNodeGroup$aws:eks/nodeGroup:NodeGroup::gpu",
          "parent": "<parent URN>",
          "custom": true,       # false for component resources
          "inputs": {...},      # as the provider would receive them, keys sorted
          "options": {"protect": ..., "retain_on_delete": ..., "delete_before_replace": ...,
                      "ignore_changes": [...], "replace_on_changes": [...], "depends_on": [URN, ...],
                      "provider": "<provider name>", "aliases": [URN, ...],
                      "additional_secret_outputs": [...], "custom_timeouts": {...}}
        }, ...
      ],
      "outputs": {...}          # the stack outputs, resolved
    }

The root `pulumi:pulumi:Stack` resource is not listed: it has no inputs or
options, its URN follows from project and stack, and its outputs are the
document's `outputs`. Resources directly under it have its URN as `parent`.

Values are written as plain JSON:

- values only the cloud knows are stable placeholders: what the recording
  engine answers for ids, ARNs and other computed outputs (`<id:NAME>`,
  `<arn:NAME>`, ...), and `"<computed>"` for a value that is still unknown;
- secrets are `{"<secret>": true}`, never the value;
- numbers the engine carried as floats are written as ints when integral
  (the wire format has only doubles: `desiredSize: 4`, not `4.0`);
- assets and archives are described (`{"<asset>": "file", "path": ...}`), and a
  resource reference is `{"<resource>": URN-or-type::name}`.

Two runs give the same bytes with `dump(doc)` (`json.dumps(doc, indent=2,
sort_keys=True)`). A config mistake or an infeasible plan (the program's
`UserError` or `pulumi.RunError`) becomes a `UserError` with the program's
message; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import runpy
from pathlib import Path
from typing import Any

import yaml

from infra.config import REPO_ROOT, engine_config
from infra.errors import UserError
from infra.preview.markers import COMPUTED, SECRET



def project_name(root: Path) -> str:
    """The `name:` of the project's `Pulumi.yaml` (or `Pulumi.yml`)."""
    path = next((root / n for n in ("Pulumi.yaml", "Pulumi.yml") if (root / n).is_file()), None)
    if path is None:
        raise UserError(f"no Pulumi.yaml in {root}: not a Pulumi project directory")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    name = doc.get("name") if isinstance(doc, dict) else None
    if not isinstance(name, str) or not name:
        raise UserError(f"{path} has no project name (a 'name:' key)")
    return name


def plain(value: Any) -> Any:
    """A recorded value (inputs or outputs) as deterministic, JSON-able data."""
    # Imported here: importing pulumi costs time that `diff` does not need.
    import pulumi
    from pulumi.output import Unknown
    from pulumi.runtime import rpc

    def conv(v: Any) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return COMPUTED if v == rpc.UNKNOWN else v
        if isinstance(v, Unknown):
            return COMPUTED
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            if not math.isfinite(v):
                return str(v)
            return int(v) if v.is_integer() else v
        if isinstance(v, dict):
            if rpc.is_rpc_secret(v):
                return dict(SECRET)
            return {str(k): conv(v[k]) for k in sorted(v, key=str)}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, pulumi.FileAsset):
            return {"<asset>": "file", "path": str(v.path)}
        if isinstance(v, pulumi.StringAsset):
            return {"<asset>": "string", "text": v.text}
        if isinstance(v, pulumi.RemoteAsset):
            return {"<asset>": "remote", "uri": v.uri}
        if isinstance(v, pulumi.FileArchive):
            return {"<archive>": "file", "path": str(v.path)}
        if isinstance(v, pulumi.RemoteArchive):
            return {"<archive>": "remote", "uri": v.uri}
        if isinstance(v, pulumi.AssetArchive):
            return {"<archive>": "assets", "assets": conv(dict(v.assets))}
        if isinstance(v, pulumi.Resource):
            return {"<resource>": f"{getattr(v, '_type', '?')}::{getattr(v, '_name', '?')}"}
        return f"<{type(v).__name__}>"

    return conv(value)


def document(recording, project: str, stack: str) -> dict:
    """The synth document of a `Recording` (see the module docstring)."""
    from infra.preview.recording import STACK_TYPE

    resources = []
    for r in recording.resources:
        if r.type == STACK_TYPE and not r.parent:
            continue
        resources.append(
            {
                "type": r.type,
                "name": r.name,
                "urn": r.urn,
                "parent": r.parent,
                "custom": r.custom,
                "inputs": plain(r.inputs),
                "options": plain(r.options),
            }
        )
    resources.sort(key=lambda d: d["urn"])
    urns = [d["urn"] for d in resources]
    if len(set(urns)) != len(urns):
        dupes = sorted({u for u in urns if urns.count(u) > 1})
        raise UserError(f"stack {stack}: two resources share a URN (the engine would refuse them): {', '.join(dupes)}")
    return {
        "project": project,
        "stack": stack,
        "resources": resources,
        "outputs": plain(recording.outputs),
    }


def synthesize(stack: str, root: Path | None = None) -> dict:
    """Run the program of `root` (default: this repository) for `stack`; the synth document."""
    import pulumi

    from infra.preview.recording import record

    root = Path(root).resolve() if root is not None else REPO_ROOT
    project = project_name(root)
    if not (root / "__main__.py").is_file():
        raise UserError(f"no __main__.py in {root}: the program to synthesise")
    config = engine_config(stack, root)  # a UserError names a missing or broken stack file

    def program() -> None:
        runpy.run_path(str(root), run_name="__main__")

    try:
        with contextlib.chdir(root):  # the language host runs programs in the project directory
            recording = record(program, project=project, stack=stack, config=config)
    except UserError as exc:
        raise UserError(str(exc)) from None
    except pulumi.RunError as exc:
        raise UserError(str(exc)) from None
    return document(recording, project, stack)


def dump(doc: dict) -> str:
    """The document as the bytes `synth` writes (stable: sorted keys, 2-space indent, final newline)."""
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
