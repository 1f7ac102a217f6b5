"""The docs: generated regions equal what `python -m infra docs` writes, links resolve, the README is a front door.

The generator (infra/docs.py) is run here over the checked-in pages; a page that differs
fails with the command that fixes it. The pages' prose is not generated, but every figure
of a plan, a config key or a command's output is.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from infra.docs import REGION, pages, regenerate, region_names, render_region
from tests import yaml_text

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return pages(REPO)


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_generated_regions_are_current(page: Path) -> None:
    text = page.read_text()
    assert regenerate(text) == text, f"{page.relative_to(REPO)} is out of date: run `python -m infra docs`"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_region_is_closed_on_a_line_of_its_own(page: Path) -> None:
    """An end marker glued to a line is not found, and the region would swallow the prose up to the next one."""
    text = page.read_text()
    opens = len(re.findall(r"^<!-- generated: ", text, re.M))
    closes = len(re.findall(r"(?<!    )<!-- end generated -->", text))  # an indented example of the syntax aside
    assert opens == closes == len(region_names(text)) == len(re.findall(r"^<!-- end generated -->$", text, re.M)), page


def test_a_region_whose_output_lacks_a_final_newline_stays_closed(monkeypatch) -> None:
    import infra.docs as docs

    monkeypatch.setattr(docs, "render_region", lambda name, root=None: "| a | b |")
    text = "<!-- generated: x -->\n<!-- end generated -->\nprose\n<!-- generated: y -->\n<!-- end generated -->\n"
    new = docs.regenerate(text)
    assert new == "<!-- generated: x -->\n| a | b |\n<!-- end generated -->\nprose\n<!-- generated: y -->\n| a | b |\n<!-- end generated -->\n"
    assert docs.regenerate(new) == new


def test_the_config_reference_is_generated_into_the_configuration_page() -> None:
    assert "config-reference" in region_names((REPO / "docs" / "configuration.md").read_text())


def test_an_unknown_region_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown generated region"):
        regenerate("<!-- generated: no-such-thing -->\nold\n<!-- end generated -->\n")


def test_regions_are_replaced_whole_and_the_prose_kept() -> None:
    text = "before\n<!-- generated: changes-table -->\nstale\n<!-- end generated -->\nafter\n"
    new = regenerate(text)
    assert new.startswith("before\n<!-- generated: changes-table -->\n| change |") and new.endswith("<!-- end generated -->\nafter\n")
    assert "stale" not in new


def _edited_prod(tmp_path: Path, area: str, key: str, value: object) -> Path:
    doc = yaml_text.safe_load((REPO / "Pulumi.prod.yaml").read_text())
    doc["config"][f"gpu-serving:{area}"][key] = value
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp_path


def test_changing_the_prod_config_changes_the_generated_headline(tmp_path: Path) -> None:
    """The headline is the plan's, not typed: a cheaper API price moves the break-even it reports."""
    before = render_region("headline: prod")
    doc = yaml_text.safe_load((REPO / "Pulumi.prod.yaml").read_text())
    price = doc["config"]["gpu-serving:cost"]["apiPriceUsdPerMillionTokens"]
    after = render_region("headline: prod", _edited_prod(tmp_path, "cost", "apiPriceUsdPerMillionTokens", price * 10))
    assert before != after
    assert f"${price:.2f}" in before and f"${price * 10:.2f}" in after


def test_command_output_regions_follow_the_stack_files(tmp_path: Path) -> None:
    """`output:` regions run the command against the given stack files, so a changed stack changes them."""
    root = _edited_prod(tmp_path, "serving", "maxModelLen", 65536)
    assert "131,072" in render_region("output: plan --stack prod")
    changed = render_region("output: plan --stack prod", root)
    assert "65,536" in changed and "131,072" not in changed


def test_a_failing_command_is_refused_not_written() -> None:
    with pytest.raises(ValueError, match="exited 2"):
        render_region("output: plan --stack no-such-stack")


# --------------------------------------------------------------------------- links


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    out = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and (m := re.match(r"#{1,6} (.+)", line)):
            slug = re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def _links(page: Path) -> list[tuple[int, str]]:
    text = REGION.sub("", page.read_text())
    out, in_fence = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence:
            out += [(n, target) for target in LINK.findall(line)]
    return out


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for n, target in _links(page):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.relative_to(REPO)}:{n}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{page.relative_to(REPO)}:{n}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / target.partition("#")[0]).resolve() for _, target in _links(REPO / "README.md")}
    unlinked = [str(p.relative_to(REPO)) for p in sorted((REPO / "docs").rglob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_the_readme_is_a_front_door() -> None:
    """About 150 lines: what it is, the two set-up commands, the way in, where to read next."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines: move detail to a page under docs/"
