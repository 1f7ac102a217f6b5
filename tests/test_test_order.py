"""The order bin/test runs the test files in (tests/conftest.py): the slowest first, none lost."""

from __future__ import annotations

from pathlib import Path

from tests import conftest

TESTS = Path(__file__).resolve().parent


def test_each_slowest_file_is_a_test_file_named_once():
    assert len(set(conftest.SLOWEST_FILES)) == len(conftest.SLOWEST_FILES)
    missing = [name for name in conftest.SLOWEST_FILES if not (TESTS / name).is_file()]
    assert not missing, f"tests/conftest.py SLOWEST_FILES names no test file: {missing}"


def test_the_slowest_files_go_first_in_their_order_and_the_rest_keep_theirs():
    slow = [TESTS / name for name in conftest.SLOWEST_FILES]
    rest = [TESTS / "test_access.py", TESTS / "test_zz_other.py", Path("benchmarks") / "test_a.py"]
    given = [rest[1], slow[2], rest[0], slow[0], rest[2], slow[1], *reversed(slow[3:])]
    assert conftest.slowest_files_first(given) == [*slow, rest[1], rest[0], rest[2]]


def test_the_collected_order_keeps_each_files_tests_together(request):
    """What the hook did to this run's own collection (the whole suite's, under bin/test): each
    file's tests in one run, the files in slowest_files_first's order."""
    files = [item.path for item in request.session.items]
    runs = [p for i, p in enumerate(files) if i == 0 or files[i - 1] != p]
    assert len(runs) == len(set(runs)), "a file's tests were split"
    assert runs == conftest.slowest_files_first(runs)
