"""The commands of docs/operations.md's recipes, as the tests run them.

The tests do not keep their own copy of the deployment: they read the fenced ``bash`` block
under a heading of docs/operations.md, take its ``export`` lines, its ``mlflow server`` and
``frugalnas worker`` commands, and run exactly those, with the site values (the exported
variables, the run file, hosts and ports) and the sizes (``--n-trials``, heartbeat, grace)
replaced by the test's. A flag the test replaces must be in the documented command, so the
page and the tests cannot drift apart."""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
ONE_MACHINE = "## Workers on one machine"
SEVERAL_MACHINES = "## Workers on several machines"


@dataclass
class Recipe:
    commands: list[list[str]]
    exports: dict[str, str] = field(default_factory=dict)

    def command(self, *prefix: str) -> list[str]:
        found = [c for c in self.commands if c[:len(prefix)] == list(prefix)]
        assert found, f"docs/operations.md has no `{' '.join(prefix)}` command in this recipe"
        return list(found[0])


def read_recipe(heading: str, doc: Path = DOC) -> Recipe:
    """The commands of the first ``bash`` block under ``heading``."""
    text = doc.read_text()
    assert heading in text, f"docs/operations.md has no section {heading!r}"
    section = text[text.index(heading):]
    nxt = section.find("\n## ", len(heading))
    section = section if nxt < 0 else section[:nxt]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, f"no ```bash block under {heading!r}"
    joined = match.group(1).replace("\\\n", " ")
    commands, exports = [], {}
    for line in joined.splitlines():
        tokens = shlex.split(line, comments=True)
        if not tokens:
            continue
        if tokens[0] in ("for", "done", "wait"):  # the shell loop around workers
            continue
        if tokens[-1] == "&":
            tokens = tokens[:-1]
        if tokens[0] == "export":
            for item in tokens[1:]:
                name, _, value = item.partition("=")
                exports[name] = value
            continue
        commands.append(tokens)
    return Recipe(commands, exports)


def expand(tokens: list[str], env: dict[str, str]) -> list[str]:
    def sub(token: str) -> str:
        return re.sub(r"\$\{?([A-Z_][A-Z0-9_]*)\}?",
                      lambda m: env[m.group(1)], token)
    return [sub(t) for t in tokens]


def replace_flags(tokens: list[str], values: dict[str, str]) -> list[str]:
    """``tokens`` with the value after each flag of ``values`` replaced; every flag must be
    in the documented command."""
    out = list(tokens)
    for flag, value in values.items():
        assert flag in out, f"the documented command {' '.join(tokens)!r} lost its {flag} flag"
        out[out.index(flag) + 1] = value
    return out


def mlflow_server(recipe: Recipe, env: dict[str, str], port: int) -> list[str]:
    """The recipe's ``mlflow server`` command on 127.0.0.1:port."""
    cmd = expand(recipe.command("mlflow", "server"), env)
    cmd = replace_flags(cmd, {"--host": "127.0.0.1", "--port": str(port),
                              "--allowed-hosts": f"127.0.0.1:{port}"})
    return [sys.executable, "-m", "mlflow", *cmd[1:]]


def frugalnas_worker(recipe: Recipe, env: dict[str, str], run_file: Path,
                     values: dict[str, str]) -> list[str]:
    """The recipe's ``frugalnas worker`` command with the test's run file and ``values``."""
    cmd = expand(recipe.command("frugalnas", "worker"), env)
    assert cmd[2].endswith(".toml"), f"the documented worker command has no run file: {cmd}"
    cmd[2] = str(run_file)
    cmd = replace_flags(cmd, values)
    if "-q" not in cmd:
        cmd.append("-q")
    return [sys.executable, "-m", "frugalnas.cli.main", *cmd[1:]]
