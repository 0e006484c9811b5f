"""flowlane installs anywhere: a wheel built from this checkout, installed into a clean
virtual environment outside the repository, runs the quick start of a project of its own."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.runtime.rt_support import wait_until


def _run(*args: str | Path, cwd: Path, env: dict[str, str],
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    return result


@pytest.mark.slow
def test_a_built_wheel_runs_the_quick_start_outside_the_repository(repo_root: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="flowlane-wheel-"))
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "FLOWLANE_DSN", "DATABASE_URL", "VIRTUAL_ENV")}
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", repo_root,
         cwd=work, env=env)
    [wheel] = (work / "dist").glob("flowlane-*.whl")
    _run(sys.executable, "-m", "venv", work / "venv", cwd=work, env=env)
    bin_dir = work / "venv" / "bin"
    _run(bin_dir / "pip", "install", "-q", wheel, cwd=work, env=env)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    installed = _run("python", "-c", "import flowlane; print(flowlane.__file__)", cwd=work, env=env)
    assert installed.stdout.startswith(str(work / "venv")), installed.stdout

    project = work / "proj"
    serve: subprocess.Popen[str] | None = None
    try:
        _run("flowlane", "init", project, cwd=work, env=env)
        for command in (("validate",), ("compile",), ("db", "migrate"), ("apply",)):
            _run("flowlane", *command, cwd=project, env=env)
        log = project / ".flowlane" / "logs" / "hello.log"
        with (work / "serve.out").open("w") as out:
            serve = subprocess.Popen(["flowlane", "serve"], cwd=project, env=env, text=True,
                                     stdout=out, stderr=subprocess.STDOUT)
        wait_until(lambda: log.exists() and "worker_started" in log.read_text(), timeout=120,
                   message="serve's worker for queue hello")
        started = _run("flowlane", "start", "hello", "--input", '{"name": "Ada"}', "--wait",
                       "--timeout", "120", cwd=project, env=env)
        assert '"greeting": "Hello, Ada!"' in started.stdout
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0, (work / "serve.out").read_text()
    finally:
        if serve is not None and serve.poll() is None:
            serve.kill()
        subprocess.run(["flowlane", "db", "down"], cwd=project, env=env, capture_output=True,
                       check=False, timeout=120)
        server_dir = project / ".flowlane" / "server_dir"
        if server_dir.exists():
            shutil.rmtree(server_dir.read_text().strip(), ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
