"""The console's bind rule and argument checks (no server needed for these)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowlane import errors
from flowlane.ui import app, security
from tests.cli_support import run_flowlane


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("LOCALHOST", True), ("::1", True),
    ("[::1]", True), ("0.0.0.0", False), ("::", False), ("192.168.1.20", False), ("example.com", False),
    ("localhost.example.com", False), ("", False),
])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert security.is_loopback(host) is loopback


def test_a_token_is_required_unless_the_host_is_loopback() -> None:
    security.check_bind("127.0.0.1", None)
    security.check_bind("0.0.0.0", "token")
    with pytest.raises(errors.UsageError, match="a token is required"):
        security.check_bind("0.0.0.0", None)
    with pytest.raises(errors.UsageError):
        security.check_bind("192.168.1.20", "")


@pytest.mark.parametrize(("args", "message"), [
    (("--port", "70000"), "--port must be between 0 and 65535"),
    (("--refresh", "0"), "--refresh must be positive"),
    (("--host", "192.168.1.20"), "a token is required"),
])
def test_bad_arguments_are_usage_errors(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = run_flowlane("ui", *args, "--dsn", "postgresql://unused@127.0.0.1:1/x", cwd=tmp_path,
                          env={"FLOWLANE_UI_TOKEN": ""})
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("back", "safe"), [
    ("/workers", "/workers"), ("/runs/1?x=2", "/runs/1?x=2"), ("//evil.example/", "/runs"),
    ("/\\evil.example", "/runs"), ("https://evil.example", "/runs"), ("", "/runs"), (None, "/runs"),
])
def test_actions_return_only_to_this_console(back: str | None, safe: str) -> None:
    assert app.safe_back(back) == safe
