"""Guard tests: packaging lists every package, and the layering rules hold."""

from __future__ import annotations

import ast
import configparser
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actors", "persistence", "transport")

PURE_MODULES = [
    "actors/inline_text.py",
    "persistence/inbox_core.py",
    "persistence/retention.py",
    "persistence/numbered_ids.py",
    "persistence/bulk.py",
    "persistence/session_records.py",
    "persistence/paging.py",
    "persistence/redaction.py",
    "actors/access.py",
    "actors/cli_args.py",
    "actors/passivation.py",
    "actors/brain_scope.py",
    "actors/validation.py",
    "actors/renewal_schedule.py",
    "actors/roster.py",
    "actors/rate_limit.py",
    "actors/task_rules.py",
    "actors/transcript_view.py",
    "actors/focal_policy.py",
    "actors/focal_context.py",
    "actors/focal_heartbeat.py",
    "actors/focal_heartbeat_setting.py",
    "actors/tool_schemas.py",
    "actors/cron_rules.py",
    "actors/social_rules.py",
    "actors/social_envelope.py",
    "actors/crash_check.py",
    "actors/delivery.py",
    "actors/brain_failure.py",
    "actors/http_failure.py",
    "actors/loop_rule.py",
    "transport/webhook_signature.py",
    "transport/identity.py",
    "transport/grants.py",
    "transport/invite_code.py",
    "transport/frames.py",
    "transport/handshake.py",
    "transport/link.py",
    "transport/receiver.py",
    "transport/peer_address.py",
    "transport/token_tries.py",
    "transport/handshake_slots.py",
    "transport/host_names.py",
    "transport/page_limits.py",
]
"""Modules that hold rules only: time and randomness come in as arguments."""

IMPURE_IMPORTS = {
    "threading",
    "socket",
    "time",
    "datetime",
    "random",
    "sqlite3",
    "peewee",
    "playhouse",
    "psycopg2",
    "asyncio",
    "pykka",
    "websockets",
    "uuid",
    "os",
    "subprocess",
    "concurrent",
}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(level, module) for every import in a file; level > 0 is relative."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((0, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
    return found


def test_setup_cfg_lists_every_package_folder_and_maps_it() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    # Each top folder's own walk: a hidden one (.venv, .hypothesis) may change meanwhile.
    folders = {
        f"kinbox.{p.parent.relative_to(ROOT).as_posix().replace('/', '.')}"
        for top in ROOT.iterdir()
        if top.is_dir() and not top.name.startswith(".")
        for p in top.glob("**/__init__.py")
        if p.parent.relative_to(ROOT).parts[0] in PACKAGES
    }
    assert listed == folders == {f"kinbox.{p}" for p in PACKAGES}
    mapping = dict(line.split("=") for line in cfg["options"]["package_dir"].split("\n") if line)
    assert {k.strip(): v.strip() for k, v in mapping.items()} == {
        f"kinbox.{p}": p for p in PACKAGES
    }
    for package in PACKAGES:
        assert (ROOT / package / "py.typed").exists()


@pytest.mark.parametrize("package", ["persistence", "transport"])
def test_lower_layers_never_import_actors_or_each_other(package: str) -> None:
    other = {"persistence": "transport", "transport": "persistence"}[package]
    for path in (ROOT / package).glob("*.py"):
        for level, module in imports_of(path):
            top = module.split(".")[0]
            if level >= 2:
                assert top not in ("actors", other), f"{path.name} imports ..{module}"
            if level == 0:
                assert not module.startswith(("kinbox.actors", f"kinbox.{other}")), path.name
                assert top not in ("actors", other), f"{path.name} imports {module}"


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_each_other_only_relatively(package: str) -> None:
    for path in (ROOT / package).glob("*.py"):
        for level, module in imports_of(path):
            if level == 0:
                assert module.split(".")[0] not in (*PACKAGES, "kinbox"), (
                    f"{package}/{path.name} imports {module} absolutely"
                )


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_modules_import_no_threads_sockets_clocks_or_database(module: str) -> None:
    for level, name in imports_of(ROOT / module):
        if level == 0:
            assert name.split(".")[0] not in IMPURE_IMPORTS, f"{module} imports {name}"
        else:  # errors, or another pure module of the same package
            package = module.split("/")[0]
            assert name.split(".")[0] in ("errors", "") or (
                f"{package}/{name}.py" in PURE_MODULES
            ), f"{module} imports .{name}"


FRAMEWORK_ADAPTERS = {
    "pydantic_ai": "actors/pydantic_ai_brain.py",
    "agents": "actors/openai_agents_brain.py",
    "autogen_core": "actors/autogen_brain.py",
    "autogen_ext": "actors/autogen_brain.py",
}
"""Each optional agent framework (its top-level package) and the one module that imports it."""


EXTRA_OF = {
    "pydantic_ai": ("pydantic-ai", "pydantic-ai-slim"),
    "agents": ("openai-agents", "openai-agents"),
    "autogen_core": ("autogen", "autogen-core"),
    "autogen_ext": ("autogen", "autogen-ext"),
}
"""Each framework package: the extra that installs it, and the distribution it comes in."""


def test_each_framework_a_readme_example_imports_comes_with_its_extra() -> None:
    """``pip install '.[autogen]'`` installed autogen-core alone, and the README's autogen
    example (its client from autogen-ext) failed with ModuleNotFoundError."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = cfg["options.extras_require"]
    imported: set[str] = set()
    for block in re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(),
                            re.S | re.M):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
    frameworks = sorted(imported & EXTRA_OF.keys())
    assert "autogen_ext" in frameworks  # the examples are read
    for name in frameworks:
        extra, dist = EXTRA_OF[name]
        wanted = [re.split(r"[<>=!~ \[]", line.strip())[0]
                  for line in extras[extra].splitlines() if line.strip()]
        assert dist in wanted, f"the README imports {name}; the {extra} extra lacks {dist}"


def test_an_agent_framework_is_imported_by_its_adapter_module_only() -> None:
    """The frameworks are optional extras: nothing on kinbox's core path may need one."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).glob("*.py")):
            module = str(path.relative_to(ROOT))
            for level, name in imports_of(path):
                framework = name.split(".")[0]
                if level == 0 and framework in FRAMEWORK_ADAPTERS:
                    assert FRAMEWORK_ADAPTERS[framework] == module, f"{module} imports {name}"


def test_public_names_exist() -> None:
    import kinbox.actors as actors
    import kinbox.persistence as persistence
    import kinbox.transport as transport

    for module in (actors, persistence, transport):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name} is exported but missing"
    from kinbox.actors import Runtime, ToolError  # the names the issues fix

    assert Runtime and ToolError


def test_the_code_is_ruff_clean() -> None:
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (it comes with the test extra)")
    result = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-4000:]
