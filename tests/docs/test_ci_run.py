"""
.ci/run runs the README's test command as written, in one shell with its virtual environment.

The real command installs Debian packages; here C{apt-get}, C{python3} and
the virtual environment's programs are stand-ins on C{PATH} that record what
they were asked to do, so the test checks the mechanism (extraction from the
README, activation inside C{bash -c}, ruff and mypy in the activated environment), not
Debian.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

from tests.docs.examples import ROOT

#: Debian packages the test suite needs on a fresh machine (netcat: the guide's examples;
#: Perl, PHP, Go, Java, Ruby and node with their memcache clients: tests/clients/;
#: strace: the fault harness's injection).
REQUIRED_PACKAGES = {"python3-venv", "zookeeper", "memcached", "thrift-compiler",
                     "default-jre-headless", "libmemcached-dev", "libmemcached-tools",
                     "netcat-openbsd", "strace", "libcache-memcached-perl", "php-cli",
                     "php-memcached",
                     "golang-go", "golang-github-bradfitz-gomemcache-dev",
                     "default-jdk-headless", "libspymemcached-java", "ruby", "ruby-dalli",
                     "nodejs"}
#: The npm step: the node clients pinned in tests/clients/node/package-lock.json.
NPM_STEP = "npm ci --prefix tests/clients/node --no-audit --no-fund"


def readme_command(title: str) -> str:
    """The command on the line after C{# <title>} in the README (as .ci/run finds it)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    return lines[lines.index(f"# {title}") + 1]


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_readme_test_command_installs_what_ci_needs() -> None:
    """The test command installs every needed Debian package, in a venv, with the extras."""
    command = readme_command("install everything and run the whole test suite")
    apt = command.split("apt-get install -y ", 1)[1].split(" && ", 1)[0].split()
    assert REQUIRED_PACKAGES <= set(apt)
    assert "python3 -m venv .venv && . .venv/bin/activate" in command
    assert "(command -v npm >/dev/null || apt-get install -y npm)" in command
    assert f" && {NPM_STEP} && " in command
    assert "pip install -e '.[test,analytics]' --config-settings editable_mode=compat" in command
    assert command.endswith("python -m pytest")


def test_readme_start_command_uses_a_venv() -> None:
    """The start command needs nothing but python3: it makes the venv it installs into."""
    command = readme_command("install and start the server on its built-in defaults "
                             "(memcache 22133, text 2222, thrift 2229, admin 2223, on 127.0.0.1)")
    assert command.startswith("apt-get update && apt-get install -y python3-venv && "
                              "python3 -m venv .venv && . .venv/bin/activate && pip install . ")
    assert command.endswith("twistd -n kestrel")


def test_ci_run_runs_the_readme_command_in_its_venv(tmp_path: Path) -> None:
    """.ci/run runs the README command; pytest, ruff and mypy run inside the activated venv."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    shutil.copy(ROOT / "README.md", repo / "README.md")
    log = tmp_path / "log"
    shims = tmp_path / "shims"
    shims.mkdir()
    record = f'echo "$(basename "$0") $* venv=${{VIRTUAL_ENV:-none}}" >> {log}\n'
    _executable(shims / "apt-get", f"#!/bin/sh\n{record}")
    _executable(shims / "npm", f"#!/bin/sh\n{record}")
    # python3 -m venv .venv: a venv whose activate script puts recording programs on PATH.
    _executable(shims / "python3", f"""#!/bin/sh
{record}mkdir -p .venv/bin
cat > .venv/bin/activate <<'END'
VIRTUAL_ENV="$PWD/.venv"; export VIRTUAL_ENV
PATH="$VIRTUAL_ENV/bin:$PATH"; export PATH
END
for tool in pip python ruff mypy; do
  printf '#!/bin/sh\\n{record}' > .venv/bin/$tool
  chmod +x .venv/bin/$tool
done
""")
    env = {"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([str(repo / ".ci" / "run")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    venv = f"venv={repo / '.venv'}"
    calls = log.read_text().splitlines()
    assert calls[0] == "apt-get update venv=none"
    assert calls[1].startswith("apt-get install -y python3-venv ")
    assert calls[2:] == [
        f"{NPM_STEP} venv=none",
        "python3 -m venv .venv venv=none",
        f"pip install -e .[test,analytics] --config-settings editable_mode=compat {venv}",
        f"python -m pytest {venv}",
        f"ruff check . {venv}",
        f"mypy kestrel twisted/plugins {venv}",
    ]
