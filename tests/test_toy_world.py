"""The toy task's oracle and judgments, and the toy-world bootstrap: the packaged world copied, another trained (tiny step
counts) and cached."""

import json

import numpy as np
import pytest

from rrc_jax.config import validate
from rrc_jax.data.toy import Annotator, SortTask, is_held_out, oracle_quality, parse_digits, toy_judgment
from rrc_jax.data.toy.world import WorldSettings, build_world, load_world, packaged_world
from rrc_jax.judge.verdicts import parse_verdict


def test_oracle_quality_is_graded():
    assert oracle_quality("3141", "1134") == 1.0
    assert oracle_quality("3141", "1143") == 0.5
    assert oracle_quality("3141", "113") == 0.75  # a missing position counts as wrong
    assert oracle_quality("3141", "113489") == 0.5  # each extra digit costs a position
    assert oracle_quality("3141", "9999999") == 0.0
    assert oracle_quality("3141", "x") == 0.0
    assert parse_digits(" 123 a") == "123"


def test_toy_judgment_prefers_the_better_response():
    rng = np.random.default_rng(0)
    task = SortTask()
    for _ in range(300):
        d = task.prompt(rng)
        a, b = task.demonstration(d, rng), task.demonstration(d, rng)
        text = toy_judgment(d, a, b)
        assert Annotator().judgment(d, a, b, rng) == text  # a perfect annotator writes the oracle's judgment
        assert text.startswith(" " + "".join(sorted(d)) + " a")
        want = "A" if oracle_quality(d, a) >= oracle_quality(d, b) else "B"
        assert parse_verdict(text) == want


def test_demonstrations_are_noisy_but_informative():
    rng = np.random.default_rng(1)
    task = SortTask()
    qs = [oracle_quality(d, task.demonstration(d, rng)) for d in (task.prompt(rng) for _ in range(500))]
    assert 0.4 < np.mean(qs) < 0.85 and np.std(qs) > 0.15


def test_a_world_is_trained_once_and_reused(tmp_path):
    """A world the package does not ship (here 3 training steps a model) is trained, with every model saved as a
    Hugging Face directory, and read from its cache afterwards, not trained again. (The other tests train on the
    packaged world, copied into their cache.)"""
    from conftest import tiny_config

    config = tiny_config("agr", "unused", tmp_path, **{f"toy.{role}_steps": 3 for role in ("policy", "grm", "drm")})
    settings = validate(config).toy.settings()
    assert packaged_world(settings) is None and settings.grm.steps == 3
    world = build_world(settings, tmp_path)
    stamp = (world.grm / "model.safetensors").stat().st_mtime_ns
    again = build_world(settings, tmp_path)
    assert again == world and (world.grm / "model.safetensors").stat().st_mtime_ns == stamp
    policy, grm, drm, tok = load_world(world)
    assert drm.cfg.value_head and not policy.cfg.value_head and len(tok) == policy.cfg.vocab_size
    assert grm.cfg.hidden_size == 96
    assert WorldSettings(seed=1).key() != WorldSettings().key() != settings.key()  # other settings, other caches


def test_grm_learns_the_reasoning_and_the_direct_template():
    """A fifth of the toy GRM's examples use `toy_pairwise_direct` (PRC without thinking) with the bare verdict as
    the target; with a perfect annotator the verdict of both kinds follows the oracle."""
    from rrc_jax.data.toy.task import ALPHABET
    from rrc_jax.data.toy.world import grm_examples
    from rrc_jax.models.char_tokenizer import make_char_tokenizer

    tok = make_char_tokenizer(ALPHABET)
    example = grm_examples(WorldSettings(annotator=Annotator()), tok)
    kinds = {"think:": 0, "verdict: ": 0}
    for _ in range(300):
        question, target = example()
        q, t = tok.decode(question, skip_special_tokens=True), tok.decode(target, skip_special_tokens=True)
        if q.endswith("verdict: "):
            kinds["verdict: "] += 1
            assert t in ("[[A]]", "[[B]]")
        else:
            assert q.endswith("think:") and parse_verdict(t) in ("A", "B") and len(t) > 5
            kinds["think:"] += 1
        digits, a, b = (line.split(": ")[1] for line in q.splitlines()[:3])
        assert parse_verdict(t) == ("A" if oracle_quality(digits[:-1], a) >= oracle_quality(digits[:-1], b) else "B")
        assert not is_held_out(digits[:-1])
    assert 30 < kinds["verdict: "] < 90 and kinds["think:"] > 200


def test_the_annotator_miscounts_favours_a_and_credits_padding():
    """The toy world's annotator (`TOY_ANNOTATOR`) against the oracle on its own pair stream: wrong on a sixth of
    the pairs of unequal quality and more often on close ones; position A wins more than half of the ties; and a
    padded response (extra digits) beats its unpadded self about half the time."""
    from rrc_jax.data.toy.world import annotated_pairs

    settings = WorldSettings()
    pairs = annotated_pairs(settings)
    wrong, close_wrong, ties_a = [], [], []
    for _ in range(6000):
        digits, a, b, judgment = next(pairs)
        qa, qb = oracle_quality(digits, a), oracle_quality(digits, b)
        verdict = parse_verdict(judgment)
        if qa == qb:
            ties_a.append(verdict == "A")
            continue
        wrong.append(verdict != ("A" if qa > qb else "B"))
        if abs(qa - qb) * len(digits) < 1.5:
            close_wrong.append(wrong[-1])
    assert 0.1 < np.mean(wrong) < 0.25 and np.mean(close_wrong) > np.mean(wrong) + 0.05
    assert np.mean(ties_a) > 0.6
    rng, task = np.random.default_rng(0), SortTask()
    padded = []
    for _ in range(2000):
        d = task.prompt(rng)
        right = "".join(sorted(d))
        padded.append(parse_verdict(settings.annotator.judgment(d, right + "9", right, rng)) == "A")
    assert 0.4 < np.mean(padded) < 0.75  # credited half the time, then the position bias on close calls
    assert oracle_quality(d, right + "9") < oracle_quality(d, right)


def test_evaluation_prompts_are_a_split_no_model_trains_on():
    rng, task = np.random.default_rng(0), SortTask()
    train = {task.prompt(rng) for _ in range(3000)}
    held = {task.prompt(rng, held_out=True) for _ in range(300)}
    assert not train & held and all(is_held_out(d) for d in held) and not any(is_held_out(d) for d in train)
    assert 0.08 < np.mean([is_held_out(str(i)) for i in range(1000, 10000)]) < 0.17  # an eighth of the prompts


def test_the_pointwise_judge_learns_the_toy_score():
    """The toy pointwise judge's examples (IRPO's starting point): `toy_pointwise` questions whose target's
    `score: N` (`parse_score`) is the oracle's count of right positions; its cache is its own, built once."""
    from rrc_jax.data.toy.task import ALPHABET
    from rrc_jax.data.toy.world import pointwise_examples
    from rrc_jax.judge.verdicts import parse_score
    from rrc_jax.models.char_tokenizer import make_char_tokenizer

    tok = make_char_tokenizer(ALPHABET)
    example = pointwise_examples(SortTask(), tok, np.random.default_rng(0))
    for _ in range(200):
        question, target = example()
        q, t = tok.decode(question, skip_special_tokens=True), tok.decode(target, skip_special_tokens=True)
        assert q.startswith("sort: ") and q.endswith("think:")
        digits, response = (line.split(": ")[1] for line in q.splitlines()[:2])
        assert parse_score(t) == oracle_quality(digits[:-1], response) * len(digits[:-1])


def test_pointwise_judge_is_cached_apart_from_the_world(toy_cache):
    """Only IRPO needs the toy pointwise judge: it has a cache directory of its own, built once."""
    from conftest import tiny_config
    from rrc_jax.data.toy.world import build_pointwise

    toy = validate(tiny_config("irpo", "unused", toy_cache, **{"data.format": "pairs"})).toy
    settings, spec = toy.settings(), toy.build.spec("pointwise")
    path = build_pointwise(settings, spec, toy_cache)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert build_pointwise(settings, spec, toy_cache) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert path.parent != build_world(settings, toy_cache).root and spec.steps == 4


def test_the_default_world_ships_checked_and_is_copied_not_trained(tmp_path, monkeypatch):
    """The README's first command copies the packaged default world (checked by SHA-256) instead of
    training it for 10 minutes; a damaged packaged file is a one-line error."""
    import shutil

    from rrc_jax.data.toy import world as world_lib
    from rrc_jax.errors import ConfigError

    settings = WorldSettings()
    shipped = world_lib.packaged_world(settings)
    assert shipped is not None and shipped.name == f"toy-{settings.key()}"

    def no_training(*args, **kwargs):
        raise AssertionError("the packaged world was trained again")

    for name in ("train_policy", "train_grm", "train_drm"):
        monkeypatch.setattr(world_lib, name, no_training)
    world = build_world(settings, tmp_path / "cache")
    assert world_lib._files(world.root) == json.loads((shipped / "world.json").read_text())["files"]
    policy, grm, drm, tok = load_world(world)
    assert drm.cfg.value_head and grm.cfg.hidden_size == 96 and len(tok) == policy.cfg.vocab_size

    damaged = tmp_path / "package"
    shutil.copytree(shipped, damaged / shipped.name)
    blob = damaged / shipped.name / "grm" / "model.safetensors"
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    monkeypatch.setattr(world_lib, "PACKAGED", damaged)
    with pytest.raises(ConfigError, match=r"the packaged toy world .* is damaged \(grm/model.safetensors differ"):
        build_world(settings, tmp_path / "other_cache")


@pytest.mark.slow
def test_a_rebuild_reproduces_the_packaged_world(tmp_path):
    """Training the default world from scratch (10 minutes on 2 cores) gives the packaged weights
    bit for bit on this machine's kind (XLA:CPU; another backend trains another, equally valid, world)."""
    from rrc_jax.data.toy import world as world_lib

    settings = WorldSettings()
    rebuilt = build_world(settings, tmp_path, packaged=False)
    expected = json.loads((world_lib.packaged_world(settings) / "world.json").read_text())["files"]
    assert world_lib._files(rebuilt.root) == expected
