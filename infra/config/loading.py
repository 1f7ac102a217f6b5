"""Where a stack's config comes from: its stack file, or the running Pulumi engine.

Offline tools read `Pulumi.<stack>.yaml` directly (`load_stack_file`); the
Pulumi program reads the config through the engine (`from_pulumi_config`);
both end in `from_mapping`, which validates and turns every mistake into one
`UserError`. Pulumi is imported only inside the functions that need the engine,
so the offline tools work without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infra.config.areas import AREAS, PROJECT, SECRET_KEYS
from infra.config.messages import error_message, unknown_key_message, user_error
from infra.config.stack import StackConfig
from infra.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]


# PyYAML's safe loader through libyaml where PyYAML has it (its wheels do): the same documents and
# marks, 10 times faster on a stack file's comments (a plan reads the file more than once).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def stack_file_name(stack: str) -> str:
    """`Pulumi.<stack>.yaml`; a fully qualified `org/project/stack` uses its last part."""
    return f"Pulumi.{stack.rsplit('/', 1)[-1]}.yaml"


def read_stack_file(stack: str, root: Path | None = None) -> dict[str, Any]:
    """The raw `config:` mapping of `Pulumi.<stack>.yaml` (keys like `gpu-serving:gpu`)."""
    root = Path(root) if root is not None else REPO_ROOT
    name = stack_file_name(stack)
    path = root / name
    if not path.is_file():
        present = sorted(p.name for p in root.glob("Pulumi.*.yaml"))
        stacks = ", ".join(p[len("Pulumi.") : -len(".yaml")] for p in present) or "none"
        raise UserError(
            f"no stack file {name} for stack {stack!r} in {root}; "
            f"stack files present: {', '.join(present) or 'none'} (stacks: {stacks})"
        )
    try:
        doc = yaml.load(path.read_text(), Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(f"{name} is not valid YAML{where}: {problem}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise UserError(f"{name} must be a mapping with a 'config:' key, not {type(doc).__name__}")
    config = doc.get("config") or {}
    if not isinstance(config, dict):
        raise UserError(f"{name}: 'config:' must be a mapping of key -> value")
    return config


def engine_config(stack: str, root: Path | None = None) -> dict[str, str]:
    """The config map the Pulumi CLI hands the program for `Pulumi.<stack>.yaml`.

    Strings pass as they are; objects, numbers and booleans are JSON-encoded (as
    the CLI does), which is what `pulumi.Config.get_object` decodes. Used to run
    the program under mocks with a stack's real config.
    """
    out: dict[str, str] = {}
    for key, value in read_stack_file(stack, root).items():
        out[str(key)] = value if isinstance(value, str) else json.dumps(value)
    return out


def load_stack_file(stack: str, root: Path | None = None) -> StackConfig:
    """Load and validate `Pulumi.<stack>.yaml` from `root` (default: the repository)."""
    config = read_stack_file(stack, root)
    source = stack_file_name(stack)
    areas: dict[str, Any] = {}
    region: Any = None
    profile: Any = None
    for key, value in config.items():
        key = str(key)
        if ":" not in key:
            raise UserError(
                f"{source}: config key {key!r} has no namespace; write it as {PROJECT}:{key}"
            )
        namespace, _, name = key.partition(":")
        if key == "aws:region":
            region = value
        elif key == "aws:profile":
            profile = value
        elif namespace == PROJECT and name in SECRET_KEYS:
            if not (isinstance(value, dict) and set(value) == {"secure"}):
                raise UserError(f"{source}: {key} must be a secret: set it with `pulumi config set --secret {key}`")
            # Never decrypted offline; the program reads it as a secret Output.
        elif namespace == PROJECT:
            if isinstance(value, dict) and set(value) == {"secure"}:
                raise UserError(f"{source}: {key} is a secret; whole-area secrets are not supported")
            areas[name] = value
        # Keys of other namespaces (kubernetes:..., etc.) belong to providers.
    cfg = from_mapping(stack, areas, region=region, profile=profile, source=source)
    check_secrets_set(cfg, {str(k).partition(":")[2] for k in config if str(k).startswith(PROJECT + ":")}, source)
    return cfg


def check_secrets_set(cfg: StackConfig, present: set[str], source: str) -> None:
    """Refuse a config that needs a secret key the stack does not set (the names in `present`)."""
    from infra.config.monitoring import WEBHOOK_SECRET_KEY

    if cfg.monitoring.alerts.receiver == "webhook" and WEBHOOK_SECRET_KEY not in present:
        key = f"{PROJECT}:{WEBHOOK_SECRET_KEY}"
        raise UserError(
            f"{source}: {PROJECT}:monitoring.alerts.receiver is 'webhook' but {key} is not set; set it with "
            f"`pulumi config set --secret {key} <url>`, or set the receiver to none"
        )


def from_pulumi_config() -> StackConfig:
    """Load and validate the config of the running Pulumi stack."""
    import pulumi

    stack = pulumi.get_stack()
    source = stack_file_name(stack)
    cfg = pulumi.Config(PROJECT)
    areas: dict[str, Any] = {}
    for name in [*AREAS, *(n for n in _project_config_areas() if n not in AREAS and n not in SECRET_KEYS)]:
        try:
            value = cfg.get_object(name)
        except pulumi.ConfigTypeError:
            if name in AREAS:
                raise UserError(f"{source}: {PROJECT}:{name} must be an object of keys") from None
            value = cfg.get(name)  # a plain value under an unknown name: reported below
        if value is not None:
            areas[name] = value
    aws_config = pulumi.Config("aws")
    return from_mapping(stack, areas, region=aws_config.get("region"), profile=aws_config.get("profile"), source=source)


def secret(name: str):
    """A secret config value as a secret `pulumi.Output[str]`, or None when unset.

    Refuses a value that was set in plain text (it would sit unencrypted in the
    stack file and in the state).
    """
    import pulumi
    from pulumi.runtime import config as runtime_config

    if name not in SECRET_KEYS:
        raise KeyError(name)
    key = f"{PROJECT}:{name}"
    value = pulumi.Config(PROJECT).get_secret(name)
    if value is not None and not runtime_config.is_config_secret(key):
        raise UserError(f"{key} is set in plain text; set it with `pulumi config set --secret {key}`")
    return value


def _project_config_areas() -> list[str]:
    """Names of all `gpu-serving:*` keys the engine passed in (to catch misspelt areas)."""
    try:
        from pulumi.runtime import config as runtime_config

        keys = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    except Exception:  # noqa: BLE001 - best effort: older/newer SDKs may differ
        return []
    prefix = PROJECT + ":"
    return sorted(k[len(prefix) :] for k in keys if k.startswith(prefix))


def from_mapping(
    stack: str,
    areas: dict[str, Any],
    region: Any = None,
    source: str | None = None,
    profile: Any = None,
) -> StackConfig:
    """Validate a mapping of area name -> object (the values of `gpu-serving:<area>`)."""
    source = source or stack_file_name(stack)
    unknown = [name for name in areas if name not in AREAS]
    if unknown:
        msgs = [unknown_key_message((name,), list(AREAS), area_level=True) for name in unknown]
        raise user_error(source, msgs)
    data: dict[str, Any] = {"stack": stack, **{k: v for k, v in areas.items() if v is not None}}
    if region is not None:
        data["region"] = region
    if profile is not None:
        data["aws_profile"] = profile
    try:
        return StackConfig.model_validate(data)
    except ValidationError as exc:
        raise user_error(source, [error_message(e, data) for e in exc.errors()]) from None
