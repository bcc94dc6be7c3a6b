"""A judge with int8 weights (`reward.judge.weight_qtype=int8`, `lora.frozen_base`): loaded quantized from a Hugging
Face checkpoint, computing close to the checkpoint, and, on the toy world, giving the bfloat16 judge's greedy
verdicts; the planner counts its bytes."""

import numpy as np
import pytest

from conftest import make_hf_model, tiny_config


def test_an_int8_judge_loads_quantized_and_computes_close_to_the_checkpoint(tmp_path):
    """Its projections are stored int8 with their scales (nothing else: no adapters); its logits stay within a few
    hundredths of the checkpoint's float32 ones, and greedy decoding from it runs."""
    import jax.numpy as jnp
    from flax import nnx

    from rrc_jax.models.hf_io import load_hf
    from rrc_jax.models.lora import frozen_base

    model = make_hf_model("llama3_untied", seed=1)
    model.save_pretrained(tmp_path)
    plain, int8 = load_hf(tmp_path, dtype="float32"), load_hf(tmp_path, dtype="float32", lora=frozen_base("int8"))
    assert int8.layers.attn.qkv[...].dtype == jnp.int8 and int8.layers.attn.qkv_scale[...].dtype == jnp.float32
    assert not nnx.state(int8, nnx.LoRAParam)  # no adapters
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 90, (2, 12)))
    a, b = np.asarray(plain(ids)), np.asarray(int8(ids))
    assert 0 < np.abs(a - b).max() < 0.05 * np.abs(a).max()
    assert frozen_base("") is None


def test_the_toy_judge_in_int8_gives_the_bfloat16_judges_verdicts(toy_cache, tmp_path):
    """`reward.judge.weight_qtype=int8`: the run's roles load the GRM quantized; on 48 held-out pairs in both orders,
    its greedy verdicts are the bfloat16 judge's but at most one (benchmarks/int8_judge.py: 512 pairs)."""
    import jax.numpy as jnp

    from rrc_jax.config import validate
    from rrc_jax.data.toy.task import SortTask, ToyTaskConfig, sample_pair
    from rrc_jax.inference import make_sampler
    from rrc_jax.judge import Judge, JudgeConfig
    from rrc_jax.rl.roles import Roles

    config = tiny_config("agr", tmp_path, toy_cache, **{"models.dtype": "bfloat16"})
    plain = Roles.of_run(validate(config))
    config.reward.judge.weight_qtype = "int8"
    int8 = Roles.of_run(validate(config))
    assert int8.model("grm").layers.mlp.down[...].dtype == jnp.int8
    assert plain.model("grm").layers.mlp.down[...].dtype == jnp.bfloat16
    config.reward.judge.kv_dtype = "float8_e4m3fn"
    assert Roles.of_run(validate(config)).model("grm").cfg.cache_dtype == jnp.float8_e4m3fn
    rng, task = np.random.default_rng(1), ToyTaskConfig().task
    pairs = [sample_pair(task, rng, held_out=True) for _ in range(48)]
    asking = JudgeConfig(template="toy_pairwise_cot", max_new_tokens=24, temperature=0.0)
    winners = []
    for roles in (plain, int8):
        judge = Judge(make_sampler("grm", roles.model("grm"), roles.tokenizer("grm")), roles.tokenizer("grm"), asking)
        _, log = judge.explain([SortTask.prompt_text(d) for d, _, _ in pairs], [a for _, a, _ in pairs],
                               [b for _, _, b in pairs], votes=2)
        winners.append([v.winner for v in sorted(log, key=lambda v: (v.pair, v.vote))])
    assert sum(x is not None for x in winners[0]) > 80  # the judge decides
    assert sum(x != y for x, y in zip(*winners)) <= 1


def test_the_planner_counts_an_int8_judges_bytes():
    """The GRM's resident parameters with `reward.judge.weight_qtype=int8`: a byte a projection weight (their
    scales and the embedding in bfloat16), about half of bfloat16's; with `reward.judge.kv_dtype=float8_e4m3fn`
    the judge's KV cache, a byte a value, about half too."""
    from rrc_jax import plan
    from rrc_jax.config import base_config, validate

    config = base_config("agr")
    config.models.policy = config.models.grm = "llama3-8b"
    config.models.dtype = "bfloat16"
    sizes = {}
    for qtype in ("", "int8"):
        config.reward.judge.weight_qtype = qtype
        rows = {r.name: r for r in plan.plan(validate(config), "v5e-64").rows}
        sizes[qtype] = rows["grm parameters"].bytes
        assert ("int8" in rows["grm parameters"].detail) == bool(qtype)
    assert 0.5 < sizes["int8"] / sizes[""] < 0.6
    caches = {}
    for kv in ("", "float8_e4m3fn"):
        config.reward.judge.kv_dtype = kv
        caches[kv] = {r.name: r for r in plan.plan(validate(config), "v5e-64").rows}["judge KV cache"].bytes
    assert 0.5 <= caches["float8_e4m3fn"] / caches[""] < 0.55  # (the slot masks stay a byte a slot)
    with pytest.raises(Exception, match="weight_qtype"):
        config.reward.judge.weight_qtype = "int4"
        validate(config)
