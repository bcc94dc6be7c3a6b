"""The recipes live in the top-level `configs/` and install as `rrc_jax.configs` (one copy), so
`--config=agr.py` resolves from any directory; `pyproject.toml` lists every package of the tree."""

import tomllib
from pathlib import Path

from rrc_jax import config as config_lib

REPO = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package_and_maps_the_configs():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "rrc_jax").rglob("__init__.py")}
    assert set(project["packages"]) == tree | {"rrc_jax.configs"}
    assert project["package-dir"] == {"rrc_jax.configs": "configs"}
    assert not (REPO / "rrc_jax" / "configs").exists()  # one copy of each recipe


def test_recipes_resolve_by_name_to_the_top_level_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert config_lib.CONFIG_DIR == REPO / "configs"  # the editable install maps the package to the folder
    for value in ("agr.py", "agr", "configs/agr.py"):
        assert config_lib.resolve_config_file(value) == str(REPO / "configs" / "agr.py")
    assert config_lib.resolve_config_file("study.py:quick") == str(REPO / "configs" / "study.py") + ":quick"


def test_every_command_line_is_listed_and_starts_through_cli_with_absl_flags():
    """One place and one flag style: every file with a `__main__` block (the package's commands, the benchmarks, the
    examples) is in `cli.COMMANDS`, starts through `cli.start` and neither builds an argparse parser nor reads
    `sys.argv` itself; every listed command exists."""
    from rrc_jax.cli import COMMANDS

    repo = Path(__file__).resolve().parent.parent
    found = {}
    for path in [*repo.glob("rrc_jax/**/*.py"), *repo.glob("benchmarks/*.py"), *repo.glob("examples/*.py")]:
        text = path.read_text()
        if 'if __name__ == "__main__":' not in text:
            continue
        rel = path.relative_to(repo)
        name = (str(rel) if rel.parts[0] != "rrc_jax" else
                ".".join(rel.with_suffix("").parts[1:]).removesuffix(".__main__"))
        found[name] = text
    assert sorted(found) == sorted(COMMANDS)
    for name, text in found.items():
        assert "cli.start(" in text.split('if __name__ == "__main__":')[-1], name
        assert "argparse" not in text and "sys.argv" not in text, name


def test_importing_the_package_without_torch_prints_no_advice_about_torch():
    """The first command installs no torch (the models run in JAX): transformers' "PyTorch was not found" advice, which
    a user cannot act on, is dropped; its other warnings still show."""
    import subprocess
    import sys

    hide_torch = ("import importlib.util as u; real = u.find_spec; "
                  "u.find_spec = lambda n, *a, **k: None if n.split('.')[0] == 'torch' else real(n, *a, **k); ")
    said = lambda code: subprocess.run([sys.executable, "-c", hide_torch + code], capture_output=True,  # noqa: E731
                                       text=True, check=True).stderr
    assert "PyTorch was not found" in said("import transformers")  # what the package's import drops
    err = said("import rrc_jax, transformers; transformers.logging.get_logger('transformers').warning('shown')")
    assert "PyTorch" not in err and "shown" in err
