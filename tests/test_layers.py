"""The import rule of the tree (docs/architecture.md, "Layers and the import rule"): the arrows point one way.

Every import statement of every module (function-level imports included) is read
with `ast` and judged against the layer its module lives in. A pure layer that
starts importing Pulumi or boto3, or a builder that reaches up into the
components, fails here with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CLOUD_SDKS = {"pulumi", "pulumi_aws", "pulumi_kubernetes", "pulumi_policy", "boto3", "botocore"}
TOOL_LIBS = {"typer", "rich", "matplotlib"}
PROJECT = ("infra", "components", "policies")

# layer -> the project layers it may import (itself included) and the SDKs it must not.
LAYERS: dict[str, tuple[set[str], set[str]]] = {
    "infra.catalog": ({"infra.errors", "infra.catalog"}, CLOUD_SDKS | TOOL_LIBS | {"yaml", "pydantic"}),
    "infra.planning": ({"infra.errors", "infra.catalog", "infra.planning"}, CLOUD_SDKS | TOOL_LIBS | {"yaml", "pydantic"}),
    "infra.config": ({"infra.errors", "infra.catalog", "infra.planning", "infra.config"}, CLOUD_SDKS - {"pulumi"} | TOOL_LIBS),
    "infra.aws": ({"infra.errors", "infra.catalog", "infra.planning", "infra.aws"}, CLOUD_SDKS | TOOL_LIBS),
    "infra.k8s": ({"infra.errors", "infra.catalog", "infra.planning", "infra.k8s"}, CLOUD_SDKS | TOOL_LIBS),
    # Dashboards and alert rules: pure builders from the plan's and the config's figures (issue 20).
    "infra.monitoring": ({"infra.errors", "infra.catalog", "infra.planning", "infra.monitoring"}, CLOUD_SDKS | TOOL_LIBS),
    "components": ({"infra.errors", "infra.catalog", "infra.planning", "infra.aws", "infra.k8s", "components"}, {"boto3", "botocore"} | TOOL_LIBS),
    "infra.preview": ({"infra.errors", "infra.catalog", "infra.planning", "infra.config", "infra.aws", "infra.k8s", "infra.preview", "policies"}, {"boto3"} | TOOL_LIBS - {"rich"}),
    "infra.ops": ({"infra.errors", "infra.catalog", "infra.planning", "infra.config", "infra.aws", "infra.k8s", "infra.ops"}, set()),
    "infra.cli": ({"infra"}, set()),
    # The docs generator (python -m infra docs) runs the CLI: it sits beside it, on top.
    "infra.docs": ({"infra"}, set()),
    "policies": ({"policies"}, {"boto3", "botocore"}),
}
# The composition root: the one module in components/ that reads the stack config.
EXCEPTIONS = {"components.stack": {"infra.config", "infra.monitoring"}}  # config; the rules and dashboards it builds from config and plan


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> str | None:
    for layer in sorted(LAYERS, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            # `from infra import x` names submodules.
            if node.module in ("infra", "components", "policies"):
                out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


def _allowed(target: str, allowed: set[str]) -> bool:
    return any(target == a or target.startswith(a + ".") for a in allowed)


SOURCES = sorted(
    p for d in ("infra", "components", "policies") for p in (REPO / d).rglob("*.py") if "scripts" not in p.relative_to(REPO).parts
)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_imports_point_one_way(path: Path) -> None:
    module = _module_name(path)
    layer = _layer(module)
    if layer is None:
        assert module in ("infra", "infra.__main__", "infra.errors"), f"{module} is in no layer of docs/architecture.md's tree"
        return
    allowed, forbidden = LAYERS[layer]
    allowed = allowed | EXCEPTIONS.get(module, set())
    problems = []
    for line, target in _imports(path):
        top = target.split(".")[0]
        if top in forbidden:
            problems.append(f"line {line}: {layer} must not import {target}")
        if top in PROJECT and target not in ("infra", "components", "policies") and not _allowed(target, allowed):
            problems.append(f"line {line}: {layer} must not import {target}")
    assert not problems, f"{path.relative_to(REPO)}: " + "; ".join(problems)


def test_pure_layers_hold_no_cloud_sdk() -> None:
    """The issue's rule in one line: nothing under planning/ or catalog/ imports pulumi, boto3 or botocore."""
    pure = [p for p in SOURCES if _layer(_module_name(p)) in ("infra.planning", "infra.catalog")]
    assert len(pure) >= 10
    for path in pure:
        assert not {t.split(".")[0] for _, t in _imports(path)} & CLOUD_SDKS, path


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import pulumi\n    from components.stack import build\n")
    found = [t for _, t in _imports(bad)]
    assert found == ["pulumi", "components.stack"]
    allowed, forbidden = LAYERS["infra.planning"]
    assert "pulumi" in forbidden and not _allowed("components.stack", allowed)


def test_no_source_file_passes_800_lines() -> None:
    long = {str(p.relative_to(REPO)): n for p in SOURCES + [REPO / "__main__.py"] if (n := len(p.read_text().splitlines())) > 800}
    assert not long, f"files over 800 lines (find the seam): {long}"
