"""A real moto server on 127.0.0.1 for the boto3 tools (pre-flight, leak sweeper).

Import the fixtures into a test module:

    from tests.moto_server import aws, moto_server  # noqa: F401  (pytest fixtures)

- `moto_server` (session): starts `moto.server.ThreadedMotoServer` on 127.0.0.1
  at a free port chosen by the OS, once per test session, and stops it at the end.
  Yields its URL, e.g. `http://127.0.0.1:41234`.
- `aws` (function): points boto3 at that server the standard way, through
  environment variables only (`AWS_ENDPOINT_URL`, fake `AWS_ACCESS_KEY_ID` /
  `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`; shared config and credential
  files pointed at nothing, so no profile on the machine is read, and the EC2
  instance metadata service is switched off), resets the server's state, and
  refuses, for the duration of the test, any socket connection from this process
  to an address other than 127.0.0.1. A subprocess started with `os.environ`
  inherits the same settings. Yields the URL. The sessions the tools make
  (infra/ops/aws.py new_session) read one shared copy of botocore's service
  models (`new_session` here); `client(service)` is a client of the server made
  once per process.

Nothing here ever talks to AWS: every client the code under test builds goes to
`AWS_ENDPOINT_URL`, and the guard turns a slip into a test failure instead of a
network call.

`Gaps` fills the few holes of moto 5.2.5's server on the client side: calls it
does not implement (EC2 DescribeCapacityReservations and the placement-group
calls, Service Quotas for service code `ec2`, EKS DescribeClusterVersions) are
answered by a test-supplied function through botocore's `before-call` event,
exactly where botocore's own Stubber answers, and every canned answer is
validated against the operation's output shape in botocore's service model
(as the Stubber does), so it has the real API's form. Every other call still
goes to the moto server, and so does a call whose answer function returns None
(Service Quotas for service code `vpc`, which moto does answer).

`publish_parameter` puts an AWS public SSM parameter (`/aws/service/...`, such as
an EKS-optimised AMI's id) into the server, the way moto loads the public
parameters it ships; PutParameter refuses names under `/aws`, as AWS does.
"""

from __future__ import annotations

import functools
import os
import socket
import urllib.request
from typing import Any, Callable, Iterator, Optional

import pytest

LOOPBACK = "127.0.0.1"
REGION = "us-east-1"
ACCOUNT_ID = "123456789012"  # moto's default account


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    assert host == LOOPBACK, host
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        server.stop()


def reset(url: str) -> None:
    """Forget every resource the server holds (moto's own reset endpoint)."""
    req = urllib.request.Request(f"{url}/moto-api/reset", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback URL built above
        resp.read()


def aws_environment(url: str, region: str = REGION) -> dict[str, str]:
    """The environment variables that point boto3 (in this process or a child) at the server."""
    return {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": region,
        "AWS_REGION": region,
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_RETRY_MODE": "standard",
        "AWS_MAX_ATTEMPTS": "2",
    }


def _guard_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any outgoing connection from this process that is not to 127.0.0.1."""
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def check(address) -> None:
        if isinstance(address, tuple) and address and address[0] not in (LOOPBACK, "localhost"):
            raise AssertionError(f"test tried to connect to {address!r}; only {LOOPBACK} is allowed")

    def connect(self, address):
        check(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


@functools.cache
def _service_models():
    """One botocore loader of service models for the sessions the tests make: a new session reads and
    parses the models again (EC2's is megabytes of JSON), and the pre-flight tests alone make 50 sessions
    of six clients each (0.42 s per session with a loader of its own, 0.18 s with this one)."""
    import botocore.loaders

    return botocore.loaders.create_loader()


def new_session(region: Optional[str] = None):
    """`boto3.session.Session(region_name=region)`, as infra/ops/aws.py new_session makes it (the
    standard configuration: here the `aws` fixture's environment), reading the shared service models."""
    import boto3
    import botocore.session

    core = botocore.session.get_session()
    loader = _service_models()
    core.register_component("data_loader", loader)
    session = boto3.session.Session(botocore_session=core, region_name=region)
    loader.search_paths[:] = list(dict.fromkeys(loader.search_paths))  # boto3 appends its data path each time
    return session


@functools.cache
def _client(service: str, region: str, endpoint: str):
    return new_session(region).client(service, region_name=region)


def client(service: str, region: str = REGION):
    """A boto3 client of the moto server (the `aws` fixture's), made once per process: an EC2 client
    takes tens of milliseconds to make, and the tests that seed the server need a dozen per stack."""
    return _client(service, region, os.environ["AWS_ENDPOINT_URL"])


@pytest.fixture
def aws(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from infra.ops import aws as ops_aws

    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in aws_environment(moto_server).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(ops_aws, "new_session", new_session)
    reset(moto_server)
    _guard_connections(monkeypatch)
    yield moto_server


def publish_parameter(name: str, value: str, region: str = REGION, account_id: str = ACCOUNT_ID) -> None:
    """Publish AWS public parameter `name` in the server's SSM (the server runs in this process).

    As moto 5.2.5 adds the public parameters it ships (moto/ssm/models.py, ParameterDict._load_latest_amis:
    a `Parameter` appended to the backend's parameter dict); moto ships none under /aws/service/eks.
    """
    import datetime as dt

    from moto.ssm.models import Parameter, ssm_backends

    params = ssm_backends[account_id][region]._parameters
    params[name].append(Parameter(account_id=account_id, name=name, value=value, parameter_type="String",
                                  description=None, allowed_pattern=None, keyid=None,
                                  last_modified_date=dt.datetime.now(dt.timezone.utc), version=1, data_type="text"))  # fmt: skip


class GapError(Exception):
    """Raise from a `Gaps` answer to return an AWS error (code, message, HTTP status)."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status


class Gaps:
    """Client-side answers for calls the moto server lacks (see the module doc).

        gaps = Gaps()
        gaps.on("ec2", "DescribeCapacityReservations", lambda params: {...})
        session = gaps.session()            # a boto3 session (env: the moto server) with the answers installed
    """

    def __init__(self) -> None:
        self._answers: dict[tuple[str, str], Callable[[dict], dict]] = {}
        self.calls: list[tuple[str, str, dict]] = []  # (service, operation, params) of answered calls
        self.operations: list[tuple[str, str]] = []  # (service, operation) of every call made, in order

    def on(self, service: str, operation: str, answer: Callable[[dict], dict]) -> "Gaps":
        self._answers[(service, operation)] = answer
        return self

    def session(self, region: str = REGION):
        session = new_session(region)
        self.install(session)
        return session

    def install(self, session) -> None:
        session.events.register("before-parameter-build", self._remember)
        session.events.register("before-call", self._answer)

    def _remember(self, params: dict, model: Any, context: dict, **_: Any) -> None:
        context["gaps_params"] = dict(params)
        self.operations.append((model.service_model.service_id.hyphenize(), model.name))

    def _answer(self, model: Any, context: dict, **_: Any):
        from botocore.awsrequest import AWSResponse
        from botocore.validate import validate_parameters

        service = model.service_model.service_id.hyphenize()
        answer = self._answers.get((service, model.name))
        if answer is None:
            return None  # not a gap: the request goes to the moto server
        params = context.get("gaps_params", {})
        try:
            body = answer(params)
        except GapError as err:
            self.calls.append((service, model.name, params))
            parsed = {"Error": {"Code": err.code, "Message": err.message},
                      "ResponseMetadata": {"HTTPStatusCode": err.status}}  # fmt: skip
            return AWSResponse(None, err.status, {}, None), parsed
        if body is None:
            return None  # the answer function passes: the request goes to the moto server
        self.calls.append((service, model.name, params))
        if model.output_shape is not None:
            validate_parameters(body, model.output_shape)  # the canned answer has the real API's form
        return AWSResponse(None, 200, {}, None), {**body, "ResponseMetadata": {"HTTPStatusCode": 200}}
