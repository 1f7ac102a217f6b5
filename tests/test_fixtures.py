"""tests/fixtures: the upstream data the tests check against, and the script that refreshes it.

- Every file the refresh script manages is present, and nothing else lies in
  `upstream/` or `models/` (a stale copy would go unnoticed).
- The models are the catalog's, and the chart table agrees with the upstream
  copies' own Chart.yaml.
- A missing fixture fails under `CI=true` and skips otherwise, naming the path.
- The script's dry run on a reference directory laid out like the project's
  reference set reports unchanged, changed and missing files and writes
  nothing; a real run into another directory copies byte for byte.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.catalog.models import CATALOG
from infra.k8s.helm_values import CHARTS
from tests.fixtures import refresh
from tests import yaml_text

FIXTURES = Path(refresh.__file__).resolve().parent
MANAGED = refresh.copied_files() + refresh.rendered_files()


@pytest.mark.parametrize("rel", MANAGED)
def test_every_managed_fixture_is_present(rel, fixture_file):
    path = fixture_file(*rel.split("/"))
    assert path.is_file() and path.stat().st_size > 0, path
    if rel.endswith((".yaml", ".json")):
        assert yaml_text.safe_load(path.read_text()), rel  # JSON is YAML


def test_nothing_unmanaged_in_the_copied_areas():
    """A file in upstream/ or models/ the script does not manage would never be refreshed (missing ones: above)."""
    present = {p.relative_to(FIXTURES).as_posix() for area in ("upstream", "models")
               for p in (FIXTURES / area).rglob("*") if p.is_file()}
    assert sorted(present - set(refresh.copied_files())) == []


def test_the_fixture_models_are_the_catalogs():
    assert set(refresh.MODELS) == {entry.hf_repo for entry in CATALOG.values()}, (
        "MODELS in tests/fixtures/refresh.py must list every catalog model's Hugging Face repository; "
        "edit it and run the script"
    )
    assert len(set(refresh.MODELS)) == len(refresh.MODELS)


def test_the_chart_table_matches_the_upstream_copies(fixture_file):
    entries = yaml_text.safe_load(fixture_file("charts.yaml").read_text())["charts"]
    assert {e["chart"]: e["upstream_folder"] for e in entries} == {c.chart: f"upstream/{c.upstream_folder}" for c in CHARTS}
    assert set(refresh.UPSTREAM) == {c.upstream_folder for c in CHARTS}
    for entry in entries:
        folder = entry["upstream_folder"].split("/", 1)[1]
        assert entry["upstream"].startswith(f"https://github.com/{refresh.UPSTREAM[folder].project}/"), entry
        assert entry["source"]
        if "Chart.yaml" in refresh.UPSTREAM[folder].files:
            meta = yaml_text.safe_load(fixture_file("upstream", folder, "Chart.yaml").read_text())
            assert (meta["name"], str(meta["version"])) == (entry["chart"], entry["version"])
            assert str(meta.get("appVersion")) == entry.get("app_version", str(meta.get("appVersion")))
    assert [e["app_version"] for e in entries if "app_version" in e] == ["v0.5.20"]


def test_the_addon_table_names_its_source(fixture_file):
    doc = yaml_text.safe_load(fixture_file("eks_addons.yaml").read_text())
    assert doc["source"].startswith("FACTS.md") and doc["upstream"].startswith("https://docs.aws.amazon.com/eks/")
    names = [a["name"] for a in doc["addons"]]
    assert len(names) == len(set(names)) and {"vpc-cni", "coredns", "kube-proxy"} <= set(names)


# ---- a missing fixture -------------------------------------------------------------------------------


def test_a_missing_fixture_fails_under_ci(fixture_file, monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as failed:
        fixture_file("upstream", "no-such-chart-0.0.0", "values.yaml")
    assert str(FIXTURES / "upstream" / "no-such-chart-0.0.0" / "values.yaml") in str(failed.value)
    assert "tests/fixtures/refresh.py" in str(failed.value)


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_a_missing_fixture_skips_outside_ci(fixture_file, monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception) as skipped:
        fixture_file("models", "nobody--nothing", "config.json")
    assert str(FIXTURES / "models" / "nobody--nothing" / "config.json") in str(skipped.value)
    assert "tests/fixtures/refresh.py" in str(skipped.value)


def test_a_present_fixture_is_returned_as_is(fixture_file, monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert fixture_file("charts.yaml") == FIXTURES / "charts.yaml"


# ---- the refresh script -------------------------------------------------------------------------------


def _facts_excerpt(charts: list[dict], addons: list[dict]) -> str:
    """The two places of FACTS.md the script reads, in FACTS.md's own layout (a wrapped bullet, a table)."""
    names = ", ".join(f"`{a['name']}`" + (f" ({a['note']})" if "note" in a else "") for a in addons)
    wrapped = names.replace(", ", ",\n  ", 3)
    rows = "\n".join(
        f"| {c['component']} | {c['repository']} | {c['chart']} | {c['version']}"
        + (f" (app {c['app_version']})" if "app_version" in c else "") + " |"
        for c in charts
    )
    return (
        "# Facts for the build\n\n## EKS\n\n- API endpoint: private access only.\n"
        f"- Add-on names: {wrapped}.\n- Another fact, with `backticks` that are not add-ons.\n\n"
        "## Helm charts (copies of their defaults in `upstream/`)\n\n"
        f"| component | repository | chart | version |\n|---|---|---|---|\n{rows}\n\n"
        "- A note under the table.\n\n## KubeRay\n\n| a | https://example.com | b | c |\n"
    )


@pytest.fixture
def reference(tmp_path, fixture_file) -> Path:
    """A reference directory laid out like the project's reference set, holding what the fixtures hold."""
    ref = tmp_path / "shared"
    for rel in refresh.copied_files():
        (ref / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fixture_file(*rel.split("/")), ref / rel)
    charts = yaml_text.safe_load(fixture_file(refresh.CHARTS_FILE).read_text())["charts"]
    addons = yaml_text.safe_load(fixture_file(refresh.ADDONS_FILE).read_text())["addons"]
    (ref / "FACTS.md").write_text(_facts_excerpt(charts, addons))
    (ref / "upstream" / "kuberay-operator-1.7.0" / "ray.io_rayservices.yaml").write_text("not read by the tests\n")
    return ref


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_dry_run_on_an_identical_reference_reports_nothing_to_do(reference, capsys):
    before = _snapshot(FIXTURES)
    assert refresh.main([str(reference), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{len(MANAGED)} unchanged, 0 would be changed, 0 would be added, 0 problem(s)" in out
    assert out.count("\n") == 1, out  # the summary only: extra upstream files are not copied
    assert _snapshot(FIXTURES) == before


def test_dry_run_reports_changes_and_missing_files_and_writes_nothing(reference, capsys):
    values = reference / "upstream" / "gpu-operator-v26.7.0" / "values.yaml"
    values.write_bytes(values.read_bytes() + b"newKey: true\n")
    (reference / "models" / "Qwen--Qwen3-0.6B" / "config.json").unlink()
    facts = reference / "FACTS.md"
    facts.write_text(facts.read_text().replace("`coredns`", "`coredns`, `new-addon`"))
    before = _snapshot(FIXTURES)
    assert refresh.main([str(reference), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "changed: upstream/gpu-operator-v26.7.0/values.yaml" in out
    assert "changed: eks_addons.yaml" in out
    assert "missing from the reference: models/Qwen--Qwen3-0.6B/config.json" in out
    assert f"{len(MANAGED) - 3} unchanged, 2 would be changed, 0 would be added, 1 problem(s)" in out
    assert _snapshot(FIXTURES) == before


def test_a_real_run_copies_verbatim_into_its_destination(reference, tmp_path, capsys):
    dest = tmp_path / "fixtures"
    for rel in MANAGED:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(FIXTURES / rel, dest / rel)
    shutil.rmtree(dest / "models" / "openai--gpt-oss-120b")
    crd = reference / "upstream" / "kuberay-operator-1.7.0" / "ray.io_rayclusters.yaml"
    crd.write_bytes(crd.read_bytes().replace(b"\n", b"\r\n", 1))  # a one-byte change a text diff might hide
    facts = reference / "FACTS.md"
    facts.write_text(facts.read_text().replace("| v26.7.0 |", "| v26.8.0 |"))
    before = _snapshot(dest)
    assert refresh.main([str(reference), "--dest", str(dest)]) == 1  # no upstream folder for v26.8.0
    out = capsys.readouterr().out
    assert "no upstream folder gpu-operator-v26.8.0 in UPSTREAM" in out and "nothing written" in out
    assert _snapshot(dest) == before
    facts.write_text(facts.read_text().replace("| v26.8.0 |", "| v26.7.0 |"))
    assert refresh.main([str(reference), "--dest", str(dest)]) == 0
    out = capsys.readouterr().out
    assert "added: models/openai--gpt-oss-120b/config.json" in out
    assert "changed: upstream/kuberay-operator-1.7.0/ray.io_rayclusters.yaml" in out
    assert _snapshot(dest) == {rel: (reference / rel).read_bytes() for rel in refresh.copied_files()} | {
        rel: (FIXTURES / rel).read_bytes() for rel in refresh.rendered_files()
    }
    assert refresh.main([str(reference), "--dest", str(dest)]) == 0
    assert f"{len(MANAGED)} unchanged, 0 changed, 0 added" in capsys.readouterr().out


def test_the_script_runs_on_the_standard_library_alone(reference, tmp_path):
    proc = subprocess.run([sys.executable, "-S", "-I", str(FIXTURES / "refresh.py"), str(reference), "--dry-run"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(MANAGED)} unchanged" in proc.stdout
    proc = subprocess.run([sys.executable, "-S", "-I", str(FIXTURES / "refresh.py"), "--urls"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    urls = dict(line.split("\t", 1) for line in proc.stdout.splitlines() if not line.startswith("#"))
    assert set(urls) == set(MANAGED)
    assert urls["upstream/kuberay-operator-1.7.0/ray.io_rayclusters.yaml"] == (
        "https://raw.githubusercontent.com/ray-project/kuberay/v1.7.0/helm-chart/kuberay-operator/crds/ray.io_rayclusters.yaml"
    )


def test_a_missing_reference_directory_is_an_error(tmp_path, capsys):
    assert refresh.main([str(tmp_path / "absent"), "--dry-run"]) == 1
    assert "reference directory not found" in capsys.readouterr().out
