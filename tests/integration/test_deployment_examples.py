"""The deployment examples (docs/production.md): the systemd unit passes
`systemd-analyze verify`, and the Dockerfile agrees with the manifests that run its image."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from flowlane import defaults
from flowlane.app import manifests

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
UNIT = EXAMPLES / "systemd" / "flowlane-worker@.service"
INSTALLED_AT = "/srv/flowlane/venv/bin/flowlane"


def verify(unit_text: str, directory: Path) -> str:
    """`systemd-analyze verify` on a copy whose ExecStart names a program that exists here
    (verify refuses a missing one): everything it printed, empty when the unit is clean."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: run `sh tools/install-systemd.sh`"
    path = directory / UNIT.name
    path.write_text(unit_text.replace(INSTALLED_AT, "/bin/true"))
    done = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    return f"{done.returncode}: {done.stdout}{done.stderr}".strip()


def test_the_unit_file_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    text = UNIT.read_text()
    assert INSTALLED_AT in text
    assert verify(text, tmp_path) == "0:"
    # the check is live: a misspelt setting is reported
    assert "Failed to parse service restart specifier" in verify(
        text.replace("Restart=on-failure", "Restart=sometimes"), tmp_path)


def test_the_unit_stops_gracefully_and_never_restarts_a_disabled_worker() -> None:
    text = UNIT.read_text()
    timeout = float(re.search(r"--shutdown-timeout (\S+)", text)[1])  # type: ignore[index]
    assert f"TimeoutStopSec={manifests.grace_period(timeout)}\n" in text
    assert manifests.grace_period(timeout) == timeout + defaults.SHUTDOWN_MARGIN
    assert re.search(r"^RestartPreventExitStatus=.*\b3\b", text, re.MULTILINE)


def test_the_dockerfile_runs_what_the_manifests_expect() -> None:
    text = (EXAMPLES / "Dockerfile").read_text()
    options = manifests.KubernetesOptions()
    assert f"-t {options.image} ." in text  # the image the manifests name by default
    assert 'ENTRYPOINT ["flowlane"]' in text  # the manifests' command
    user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user and user[-1].isdigit() and user[-1] != "0"  # runAsNonRoot can check it
    assert ".flowlane/" in (EXAMPLES / ".dockerignore").read_text().split()
