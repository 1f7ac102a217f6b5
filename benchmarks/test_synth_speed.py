"""How long `synth` of prod takes, against the bare import of the Pulumi SDKs it needs.

    venv/bin/python -m pytest benchmarks/test_synth_speed.py --benchmark-only -s

pytest-benchmark; not part of the unit tests. Target (issue: AWS foundation):
the program itself (config, plan, components, the mocked engine) adds little
to the time Python takes to import pulumi_aws and pulumi_kubernetes.

- `synth prod, in process`: `synthesize("prod")` with every module already
  imported: what the program and the recording engine cost.
- `synth prod, fresh process`: `python -m infra synth --stack prod` as CI runs
  it, interpreter start and imports included.
- `import pulumi_aws, pulumi_kubernetes`: the baseline in a fresh process. Both
  packages load lazily: `import pulumi_aws.ec2` loads nothing more, the first
  use of a class (`pulumi_aws.ec2.Vpc`) loads its module and the submodule's
  input and output types (`pulumi_aws.ec2._inputs` alone is ~50 ms). So the
  fair floor for a fresh synth is a second baseline that also touches every
  resource class the prod program declares (read from a synth of prod:
  `aws:ec2/vpc:Vpc` -> `pulumi_aws.ec2.Vpc`), the way the program would.

`test_summary` prints the figures side by side (run with `-s`).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.preview.recording import sdk_class_path
from infra.preview.synth import synthesize

REPO_ROOT = Path(__file__).resolve().parent.parent

IMPORT_SDKS = "import pulumi_aws, pulumi_kubernetes"
PACKAGES = {"aws": "pulumi_aws", "kubernetes": "pulumi_kubernetes"}


def classes_used(doc: dict) -> list[str]:
    """The SDK classes behind the document's resource types: `aws:ec2/vpc:Vpc` -> `pulumi_aws.ec2.Vpc`.

    The class each package registers for the token (`sdk_class_path`, as the recording engine finds it);
    a custom resource (ray.io/v1) has none of its own: the generic class.
    """
    found = set()
    for r in doc["resources"]:
        pkg, module, name = r["type"].split(":", 2)
        if pkg == "pulumi" and module == "providers" and name in PACKAGES:
            found.add(f"{PACKAGES[name]}.Provider")
        elif pkg in PACKAGES:
            found.add(sdk_class_path(r["type"]) or "pulumi_kubernetes.apiextensions.CustomResource")
    return sorted(found)


CLASSES = classes_used(synthesize("prod"))
IMPORT_SDKS_AND_CLASSES = IMPORT_SDKS + "; " + "; ".join(CLASSES)
SYNTH_FRESH = "import sys; from infra.cli.app import main; sys.argv = ['infra', 'synth', '--stack', 'prod', '--out', '/dev/null']; main()"


def _python(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, capture_output=True)


def _fresh(code: str, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        _python(code)
        times.append(time.perf_counter() - start)
    return times


@pytest.mark.benchmark(group="synth prod")
def test_synth_prod_in_process(benchmark):
    synthesize("prod")  # warm: imports done once
    doc = benchmark(synthesize, "prod")
    assert doc["outputs"]["plan"]["feasible"]


@pytest.mark.benchmark(group="synth prod")
def test_synth_prod_fresh_process(benchmark):
    benchmark.pedantic(_python, args=(SYNTH_FRESH,), rounds=5, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="synth prod")
def test_import_pulumi_aws_and_kubernetes(benchmark):
    benchmark.pedantic(_python, args=(IMPORT_SDKS,), rounds=5, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="synth prod")
def test_import_pulumi_aws_classes_the_program_uses(benchmark):
    assert any(c.startswith("pulumi_aws.eks.") for c in CLASSES), CLASSES
    benchmark.pedantic(_python, args=(IMPORT_SDKS_AND_CLASSES,), rounds=5, iterations=1, warmup_rounds=1)


def test_summary(benchmark):
    """The figures side by side: what the program adds on top of the imports."""
    rounds = 5
    _python(IMPORT_SDKS_AND_CLASSES)  # warm the file cache
    sdks = statistics.median(_fresh(IMPORT_SDKS, rounds))
    classes = statistics.median(_fresh(IMPORT_SDKS_AND_CLASSES, rounds))
    fresh = statistics.median(_fresh(SYNTH_FRESH, rounds))
    synthesize("prod")
    benchmark.pedantic(synthesize, args=("prod",), rounds=rounds, iterations=1)
    in_process = benchmark.stats.stats.median
    benchmark.extra_info.update(
        import_sdks_s=round(sdks, 3),
        import_sdks_and_classes_s=round(classes, 3),
        synth_fresh_process_s=round(fresh, 3),
        synth_in_process_s=round(in_process, 3),
        program_adds_s=round(fresh - classes, 3),
    )
    rows = [
        ("import pulumi_aws, pulumi_kubernetes (fresh process)", sdks),
        (f"  + the {len(CLASSES)} resource classes prod declares", classes),
        ("synth --stack prod (fresh process)", fresh),
        ("synthesize('prod') in process, imports done", in_process),
        ("synth minus the SDK imports: interpreter, CLI, config,", fresh - classes),
        ("  planner, program and recording engine", None),
    ]
    print()
    for label, seconds in rows:
        print(f"{label:<56}" + (f"{seconds:6.2f} s" if seconds is not None else ""))
    assert in_process > 0 and fresh > 0
