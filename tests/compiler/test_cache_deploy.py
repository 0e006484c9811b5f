"""A step's cache through compile, plan and apply on a real database: adding or changing it, and
changing the handler of a cached step, are option changes, which apply writes (the fingerprint
its entries are kept under changes with the handler)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.compiler.test_cli import commit_all, git, run, run_joined

pytestmark = pytest.mark.slow

FLOWS = """\
kind: flow
slug: docs
steps:
  fetch:
    handler: library.docs:fetch
"""



def _step(dsn: str) -> tuple[object, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select opt_cache_ttl, opt_cache_key, opt_cache_fingerprint from flowlane.steps "
                           "where flow_slug = 'docs' and step_slug = 'fetch'").fetchone()
    assert row is not None
    return tuple(row)


def _change(capsys: pytest.CaptureFixture[str], dsn: str, flows: Path, text: str) -> str:
    flows.write_text(text)
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert code == 0, out
    code, applied = run_joined(capsys, "apply", "--dsn", dsn)
    assert code == 0, applied
    assert "NO_CHANGE             flow docs" in run_joined(capsys, "plan", "--dsn", dsn)[1]
    return out


def test_a_cache_and_a_cached_step_s_handler_are_option_changes(
        dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "flows").mkdir()
    flows = tmp_path / "flows" / "docs.yaml"
    monkeypatch.chdir(tmp_path)
    _change(capsys, dsn, flows, FLOWS)
    assert _step(dsn) == (None, None, None)
    cached = FLOWS + "    cache: {ttl: 1h, key: [/url, /lang]}\n"
    out = _change(capsys, dsn, flows, cached)
    assert ("SAFE_OPTION_CHANGE    flow docs\n"
            "  step fetch: cache: none in the database, 3600s per /url, /lang in the YAML\n") in out
    ttl, key, fingerprint = _step(dsn)
    assert (ttl, key) == (3600, ["/url", "/lang"]) and isinstance(fingerprint, str)
    out = _change(capsys, dsn, flows, cached.replace("library.docs:fetch", "library.docs:fetch_v2"))
    assert ("SAFE_OPTION_CHANGE    flow docs\n"
            "  step fetch: cache: the step's handler or shape changed (its cached outputs are not reused)\n"
            ) in out
    assert _step(dsn)[:2] == (3600, ["/url", "/lang"]) and _step(dsn)[2] != fingerprint
    out = _change(capsys, dsn, flows, FLOWS)
    assert "  step fetch: cache: 3600s per /url, /lang in the database, none in the YAML\n" in out
    assert _step(dsn) == (None, None, None)


def test_check_base_shows_a_cache_change_as_an_option_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "flows").mkdir()
    monkeypatch.chdir(tmp_path)
    git(tmp_path, "init", "-q")
    (tmp_path / "flows" / "docs.yaml").write_text(FLOWS + "    cache: {ttl: 1h}\n")
    assert run(capsys, "compile")[0] == 0
    commit_all(tmp_path)
    (tmp_path / "flows" / "docs.yaml").write_text(FLOWS + "    cache: {ttl: 1d, key: /url}\n")
    assert run(capsys, "compile")[0] == 0
    code, out, _ = run(capsys, "check")
    assert code == 0, out  # an option: no new version needed
    assert out.splitlines()[:-1] == [
        "SAFE_OPTION_CHANGE flow docs step fetch: cache_ttl: 3600 at HEAD, 86400 in the YAML",
        "SAFE_OPTION_CHANGE flow docs step fetch: cache_key: none at HEAD, array['/url']::text[] in the YAML",
    ]
