"""The package's layers (docs/design.md, "Layers"): every import of `rrc_jax`, a function's included, goes down the
declared list or stays within its line; the check fails on a planted upward import."""

import ast
import re
import shutil
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def declared_layers() -> list[list[str]]:
    """The lines of docs/design.md's `layers` block, bottom first: the module names (relative to `rrc_jax`) of each."""
    block = re.search(r"```layers\n(.*?)```", (ROOT / "docs" / "design.md").read_text(), re.S)
    assert block, "docs/design.md has no ```layers block"
    return [line.split() for line in block.group(1).strip().splitlines()]


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    """The line of `module` (dotted, `rrc_jax.` included): that of its longest declared name."""
    name = module.removeprefix("rrc_jax.") if module != "rrc_jax" else module
    best = None
    for i, names in enumerate(layers):
        for n in names:
            if (name == n or name.startswith(n + ".")) and (best is None or len(n) > best[1]):
                best = (i, len(n))
    return best[0] if best else None


def imports(path: Path) -> list[tuple[str, int]]:
    """The `rrc_jax` modules a file imports (at any depth: a function's imports too), with their lines."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rrc_jax"):
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "rrc_jax" else [node.module]
            out += [(n, node.lineno) for n in names]
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("rrc_jax")]
    return out


def upward_imports(package: Path, configs: Path) -> list[str]:
    """Every import of the package (and its recipes, `configs/`, installed as `rrc_jax.configs`) that goes up a
    layer, or from or to a module no line names."""
    layers, bad = declared_layers(), []
    files = [(p, p.relative_to(package.parent).with_suffix("").parts) for p in package.rglob("*.py")]
    files += [(p, ("rrc_jax", "configs", *p.relative_to(configs).with_suffix("").parts)) for p in configs.glob("*.py")]
    for path, parts in files:
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for target, line in imports(path):
            here, there = layer_of(module, layers), layer_of(target, layers)
            if here is None or there is None:
                bad.append(f"{module} -> {target}: not in a layer of docs/design.md")
            elif there > here:
                bad.append(f"{path.name}:{line}: {module} (line {here + 1}) imports {target} (line {there + 1})")
    return bad


def test_every_import_goes_down_the_layers():
    assert upward_imports(ROOT / "rrc_jax", ROOT / "configs") == []


def planted(tmp_path: Path, module: str, statement: str) -> Path:
    """A copy of the package whose `module` (a path under it) ends with a function running `statement`."""
    copy = tmp_path / "rrc_jax"
    shutil.copytree(ROOT / "rrc_jax", copy, ignore=shutil.ignore_patterns("built", "__pycache__"))
    path = copy / module
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {statement}\n")
    return copy


def test_a_planted_upward_import_fails(tmp_path):
    """The sampler protocol made to import the trainer: the check names it."""
    copy = planted(tmp_path, "inference/sampler.py", "from rrc_jax.rl.trainer import Trainer")
    (bad,) = upward_imports(copy, ROOT / "configs")
    assert re.fullmatch(r"sampler\.py:\d+: rrc_jax\.inference\.sampler \(line 4\) imports rrc_jax\.rl\.trainer "
                        r"\(line 15\)", bad), bad


def function_imports_without_a_reason(package: Path) -> list[str]:
    """Every import inside a function of the package without a comment on its line saying why it is deferred (an
    optional or heavy dependency: docs/design.md, "Layers")."""
    bad = []
    for path in package.rglob("*.py"):
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bad += [f"{path.relative_to(package.parent)}:{sub.lineno}: {lines[sub.lineno - 1].strip()}"
                        for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))
                        and "#" not in lines[sub.lineno - 1]]
    return sorted(set(bad))


def test_imports_sit_at_the_top_unless_a_comment_says_why_not(tmp_path):
    assert function_imports_without_a_reason(ROOT / "rrc_jax") == []
    copy = planted(tmp_path, "inference/engine.py", "from rrc_jax.models import Decoder")
    (bad,) = function_imports_without_a_reason(copy)
    assert re.fullmatch(r"rrc_jax/inference/engine\.py:\d+: from rrc_jax\.models import Decoder", bad), bad
