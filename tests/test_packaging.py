"""The recipes live in the top-level `configs/` and install as `rrc_jax.configs` (one copy), so
`--config=agr.py` resolves from any directory; `pyproject.toml` lists every package of the tree; the chat prompt set
(`data.path="chat"`) ships with the package, and the real-model recipe that uses it validates."""

import tomllib
from pathlib import Path

import pytest

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


def test_the_real_recipe_loads_and_validates_without_a_model():
    """`configs/real.py`: the real model as policy and judge (forced verdicts), the packaged chat prompts; validating
    resolves no model (nothing is built or loaded)."""
    from rrc_jax.configs.real import get_config

    s = config_lib.validate(get_config())
    assert (s.models.policy, s.models.grm, s.prompts.data.path, s.reward_kind) == ("real", "real", "chat", "scr")
    assert s.judge.force_verdicts and s.judge.template == "rrc_pairwise_cot"
    assert s.rollout.rows == 8 and s.steps == 4


def test_the_chat_prompts_ship_with_the_package_and_hold_out_their_tail_with_an_answer_oracle():
    """`data.path="chat"`: 96 rows in the package (`rrc_jax.data.chat`), each category in the held-out tail, no
    answer in its own prompt; the oracle is 1 when a response holds its prompt's answer."""
    from rrc_jax.data.chat import PATH, chat_rows, contains_answer
    from rrc_jax.data.prompts import DataConfig, PromptSource, load_prompts
    from rrc_jax.data.toy.task import ToyTaskConfig
    from rrc_jax.errors import ConfigError

    rows = chat_rows()
    assert PATH.parent == REPO / "rrc_jax" / "data" / "chat" and len(rows) == 96
    assert len({r["id"] for r in rows}) == len({r["prompt"] for r in rows}) == 96
    assert not any(contains_answer(r["prompt"], r["answer"]) for r in rows)
    train, held = load_prompts(PromptSource(DataConfig(path="chat"), ToyTaskConfig(), "rrc_pairwise_cot", 0))
    assert (len(train.texts), len(held.texts)) == (87, 9) and held.texts[0] == rows[87]["prompt"]
    assert {rows[r]["id"].split("-")[0] for r in held.rows} == {"arith", "units", "capital", "spell", "order", "fact"}
    answer = rows[87]["answer"]
    assert held.oracle(0, f"It is {answer}.") == 1.0 and held.oracle(0, "I do not know.") == 0.0
    assert train.oracle(0, "7 + 8 = fifteen") == 1.0  # rows[0]: "What is 7 + 8?", number words read as digits
    for response, answer, holds in [("5,000 grams", "5000", True), ("14", "4", False), ("4.5", "4", False),
                                    ("PARIS.", "Paris", True), ("Parisian", "Paris", False),
                                    ("2,4,7,9", "2, 4, 7, 9", True), ("twenty-four", "24", True)]:
        assert contains_answer(response, answer) == holds, (response, answer)
    with pytest.raises(ConfigError, match="unset data.eval_path"):
        DataConfig(path="chat", eval_path="held.jsonl")
