"""The deployment examples (docs/production.md): the systemd unit passes
`systemd-analyze verify`, and the Dockerfile agrees with the manifests that run its image."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from flowlane import defaults
from flowlane.app import manifests
from flowlane.compiler.api import load_project
from flowlane.errors import NOT_RESTARTED, WorkerExit

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
        text.replace("Restart=always", "Restart=sometimes"), tmp_path)


def test_the_unit_stops_gracefully_and_never_restarts_a_disabled_worker() -> None:
    text = UNIT.read_text()
    timeout = float(re.search(r"--shutdown-timeout (\S+)", text)[1])  # type: ignore[index]
    assert f"TimeoutStopSec={manifests.grace_period(timeout)}\n" in text
    assert manifests.grace_period(timeout) == timeout + defaults.SHUTDOWN_MARGIN



def _setting(text: str, key: str) -> str:
    [value] = re.findall(rf"^{key}=(.*)$", text, re.MULTILINE)
    return value


def test_the_unit_and_the_manifests_restart_exactly_what_the_exit_statuses_say() -> None:
    """One meaning per exit status for every supervisor: restarted unless it is in
    ``NOT_RESTARTED``; where every exit is restarted (Kubernetes), or a restart may meet a
    rollout's disabled deployment (systemd), the worker waits instead of exiting 3."""
    text = UNIT.read_text()
    assert _setting(text, "Restart") == "always"  # 0 (a stop it did not ask for), 1, 4
    prevented = {int(status) for status in _setting(text, "RestartPreventExitStatus").split()}
    assert prevented == {int(status) for status in NOT_RESTARTED}
    assert WorkerExit.RESTART not in NOT_RESTARTED and WorkerExit.FAILED not in NOT_RESTARTED
    assert "--when-disabled wait" in _setting(text, "ExecStart")

    project = load_project([EXAMPLES.parent / "flows"])
    for manifest in manifests.kubernetes(project):
        [deployment] = [d for d in manifest.documents if d["kind"] == "Deployment"]
        pod = deployment["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "Always"  # Kubernetes restarts every exit
        args = pod["containers"][0]["args"]
        assert args[args.index("--when-disabled") + 1] == "wait"  # so it never exits 3


def test_the_dockerfile_runs_what_the_manifests_expect() -> None:
    text = (EXAMPLES / "Dockerfile").read_text()
    options = manifests.KubernetesOptions()
    assert f"-t {options.image} ." in text  # the image the manifests name by default
    assert 'ENTRYPOINT ["flowlane"]' in text  # the manifests' command
    user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user and user[-1].isdigit() and user[-1] != "0"  # runAsNonRoot can check it
    assert ".flowlane/" in (EXAMPLES / ".dockerignore").read_text().split()
