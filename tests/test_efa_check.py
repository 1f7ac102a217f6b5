"""The EFA check's verdict on captured NCCL logs, and where the check sits in the stack.

The logs in tests/fixtures/nccl/ are real runs (NCCL 2.27.3, aws-ofi-nccl
1.16.2; source in tests/fixtures/README.md): one over EFA, one where the plugin
found no EFA provider and NCCL fell back to TCP sockets. The verdict must pass
the first and fail the second, also with the prefixes Ray and kubectl put before
each line, and with the older plugins' wording (their format strings, applied to
the same log). The check runs as a Job that is neither a prerequisite of the
RayCluster nor awaited by Pulumi (tests/test_serving.py has the component side).
"""

from __future__ import annotations

import re

import pytest

from infra.k8s.scripts.efa_allreduce import BUSBW_MARKER, efa_check_problems

FLOOR = 100.0
EFA_INTERFACES = 32
FAST = f"{BUSBW_MARKER}312.480\n"


@pytest.fixture(scope="module")
def efa_log(fixture_file) -> str:
    return fixture_file("nccl", "efa-aws-ofi-nccl-1.16.2.log").read_text()


@pytest.fixture(scope="module")
def tcp_log(fixture_file) -> str:
    return fixture_file("nccl", "tcp-fallback-aws-ofi-nccl-1.16.2.log").read_text()


def ray_prefixed(log: str) -> str:
    """Each line as a Ray worker's output reaches the head's log."""
    return "".join(f"(RayWorkerProc pid=4242, ip=10.0.7.12) {line}\n" for line in log.splitlines())


def test_the_fixtures_are_what_they_claim(efa_log, tcp_log):
    assert "NET/OFI Initializing aws-ofi-nccl 1.16.2" in efa_log and "NET/OFI Initializing aws-ofi-nccl 1.16.2" in tcp_log
    assert "NCCL version 2.27.3" in efa_log and "NCCL version 2.27.3" in tcp_log
    assert "via NET/Libfabric/0/GDRDMA" in efa_log and "via NET/Socket/" not in efa_log
    assert "via NET/Socket/0" in tcp_log and "Selected provider" not in tcp_log


@pytest.mark.parametrize("prefix", [False, True], ids=["plain", "ray-prefixed"])
def test_a_run_over_efa_passes(efa_log, prefix):
    log = ray_prefixed(efa_log) if prefix else efa_log
    assert efa_check_problems(log + FAST, FLOOR, EFA_INTERFACES) == []


@pytest.mark.parametrize("prefix", [False, True], ids=["plain", "ray-prefixed"])
def test_a_tcp_fallback_fails_even_at_full_bandwidth(tcp_log, prefix):
    log = ray_prefixed(tcp_log) if prefix else tcp_log
    problems = efa_check_problems(log + FAST, FLOOR, EFA_INTERFACES)
    assert any("fell back to its Socket transport (TCP)" in p and "14 channel(s)" in p for p in problems), problems
    assert any("No eligible providers were found" in p for p in problems)
    assert any("did not select the EFA provider" in p for p in problems)


def test_one_channel_over_sockets_fails_a_run_that_otherwise_used_efa(efa_log, tcp_log):
    socket_line = next(line for line in tcp_log.splitlines() if "via NET/Socket/0" in line)
    problems = efa_check_problems(efa_log + socket_line + "\n" + FAST, FLOOR, EFA_INTERFACES)
    assert problems == ["NCCL fell back to its Socket transport (TCP), not EFA: 1 channel(s) via NET/Socket"]


def test_a_provider_line_without_efa_channels_fails(efa_log):
    """The plugin loaded, but no communicator connected through it (the all-reduce never crossed nodes)."""
    no_channels = "\n".join(line for line in efa_log.splitlines() if "via NET/" not in line)
    assert efa_check_problems(no_channels + "\n" + FAST, FLOOR, EFA_INTERFACES) == [
        "no NCCL channel went through EFA (no 'via NET/Libfabric/' line)"
    ]


def test_older_plugins_wording_is_read(efa_log):
    """aws-ofi-nccl <= 1.13.x printed "Selected Provider is %s (found %d nics)", and <= 1.12.x named its
    network "AWS Libfabric" (its format strings, applied to the same run)."""
    old = re.sub(r"Selected provider is efa, fabric is efa \((found \d+ nics)\)", r"Selected Provider is efa (\1)", efa_log)
    assert old != efa_log
    assert efa_check_problems(old + FAST, FLOOR, EFA_INTERFACES) == []
    older = old.replace("NET/Libfabric/", "NET/AWS Libfabric/").replace("Using network Libfabric", "Using network AWS Libfabric")
    assert efa_check_problems(older + FAST, FLOOR, EFA_INTERFACES) == []


def test_bandwidth_below_the_floor_or_missing_fails(efa_log):
    slow = efa_check_problems(efa_log + f"{BUSBW_MARKER}41.200\n", FLOOR, EFA_INTERFACES)
    assert slow == ["all-reduce bus bandwidth 41.2 GB/s is below the floor of 100 GB/s"]
    assert efa_check_problems(efa_log, FLOOR, EFA_INTERFACES) == ["no bus bandwidth in the log: the all-reduce did not complete"]
