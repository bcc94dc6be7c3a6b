"""The judge with int8 weights (`reward.judge.weight_qtype=int8`: qwix, one scale per output channel, dequantized
a layer at a time in the decoder's scan), and with a float8 KV cache besides (`reward.judge.kv_dtype=float8_e4m3fn`),
against the same judge in bfloat16.

    python benchmarks/int8_judge.py [--pairs=512 --real_questions=16 --seed=0]

- The toy world's judge: `--pairs` held-out pairs (the evaluation split's prompts, two sampled responses each,
  `rrc_jax.data.toy.task.sample_pair`), each judged once in each order, greedily, in the toy template; the share of
  votes whose verdict (A, B or none) is the bfloat16 judge's, and each judge's abstentions.
- The real model (SmolLM2-135M-Instruct, `rrc_jax.models.real_model`): the next-token distributions on
  `--real_questions` judge questions of the packaged chat prompts (the `rrc_pairwise_cot` template, two answers
  each), each cut at a quarter, half, three quarters and its whole length and prefilled into a KV cache (so that a
  float8 cache's keys and values are what attention reads): KL(bfloat16 || variant) per position, mean and largest,
  and how often their top-1 tokens agree.

Prints a markdown table and writes benchmarks/results/int8_judge.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from absl import flags

from rrc_jax import cli

flags.DEFINE_integer("pairs", 512, "Held-out toy pairs, each judged in both orders.")
flags.DEFINE_integer("real_questions", 16, "Judge questions on the real model (0: skip it).")
flags.DEFINE_integer("seed", 0, "The pairs' sampling seed.")
flags.DEFINE_string("out", str(Path(__file__).parent / "results" / "int8_judge.json"), "JSON path.")


VARIANTS = {"bfloat16": ("", ""), "int8": ("int8", ""), "int8 + float8 KV": ("int8", "float8_e4m3fn")}


def load_variant(path, name: str):
    """The checkpoint at `path` in bfloat16 as the judge variant `name` (`VARIANTS`: weights, KV cache) stores it."""
    from rrc_jax.models.hf_io import load_hf
    from rrc_jax.models.lora import frozen_base

    weights, kv = VARIANTS[name]
    return load_hf(path, dtype="bfloat16", lora=frozen_base(weights), kv_dtype=kv)


def toy_agreement(pairs: int, seed: int) -> dict:
    """Greedy verdicts of each toy judge variant on `pairs` held-out pairs, each in both orders (module
    docstring)."""
    from rrc_jax.config import base_config, validate
    from rrc_jax.data.toy.task import SortTask, ToyTaskConfig, sample_pair
    from rrc_jax.inference import make_sampler
    from rrc_jax.judge import Judge, JudgeConfig
    from rrc_jax.models.hf_io import load_tokenizer
    from rrc_jax.rl.roles import Roles

    path = Roles.of_run(validate(base_config("agr"))).path("grm")
    tok = load_tokenizer(path)
    task, rng = ToyTaskConfig().task, np.random.default_rng(seed)
    drawn = [sample_pair(task, rng, held_out=True) for _ in range(pairs)]
    prompts = [SortTask.prompt_text(d) for d, _, _ in drawn]
    asking = JudgeConfig(template="toy_pairwise_cot", max_new_tokens=24, temperature=0.0)
    verdicts = {}
    for name in VARIANTS:
        judge = Judge(make_sampler("grm", load_variant(path, name), tok, max_batch=256), tok, asking)
        _, log = judge.explain(prompts, [a for _, a, _ in drawn], [b for _, _, b in drawn], votes=2, swap=True)
        verdicts[name] = np.asarray([v.winner for v in sorted(log, key=lambda v: (v.pair, v.vote))], object)
    out = dict(pairs=pairs, votes=int(verdicts["bfloat16"].size),
               abstentions={k: int((v == None).sum()) for k, v in verdicts.items()})  # noqa: E711
    for name in list(VARIANTS)[1:]:
        same = verdicts["bfloat16"] == verdicts[name]
        out[name] = dict(same_verdicts=int(same.sum()), agreement=float(same.mean()))
    return out


def real_kl(questions: int) -> dict:
    """KL(bfloat16 || variant) of the real model's next-token distributions on judge questions (module docstring)."""
    import jax

    from rrc_jax.data.chat import chat_rows
    from rrc_jax.inference.kernels import prefill
    from rrc_jax.judge.templates import get_template
    from rrc_jax.models.batches import pad_sequences
    from rrc_jax.models.hf_io import format_prompt, load_tokenizer
    from rrc_jax.models.real_model import real_model_dir

    path = real_model_dir()
    tok, t = load_tokenizer(path), get_template("rrc_pairwise_cot")
    ids = []
    for row in chat_rows()[:questions]:
        user = t.context.replace("{prompt}", row["prompt"]) + t.item.replace("{a}", row["answer"]).replace(
            "{b}", f"I am not sure; perhaps not {row['answer']}.")
        full = tok(format_prompt(tok, user, t.system), add_special_tokens=False)["input_ids"]
        ids += [full[:len(full) * k // 4] for k in (1, 2, 3, 4)]
    batch, mask = pad_sequences(ids, max(map(len, ids)), int(tok.pad_token_id or 0), "left")
    logp = {}
    for name in VARIANTS:
        cache = prefill(load_variant(path, name), batch, mask, cache_size=batch.shape[1])
        logp[name] = np.asarray(jax.nn.log_softmax(cache.logits, axis=-1))
    out = dict(questions=questions, positions=len(ids))
    p = logp["bfloat16"]
    for name in list(VARIANTS)[1:]:
        q = logp[name]
        kl = (np.exp(p) * (p - q)).sum(axis=-1)
        out[name] = dict(mean_kl=float(kl.mean()), max_kl=float(kl.max()),
                         top1_agreement=float((p.argmax(-1) == q.argmax(-1)).mean()))
    return out


def run() -> None:
    args = flags.FLAGS
    cli.check_at_least(1, "pairs")
    start = time.time()
    result = {"toy": toy_agreement(args.pairs, args.seed)}
    if args.real_questions:
        result["real"] = real_kl(args.real_questions)
    result["seconds"] = time.time() - start
    toy = result["toy"]
    print("| judge | toy: greedy verdicts equal to bfloat16's | toy abstentions | real: KL(bf16 || it) mean, largest "
          "| real: top-1 agreement |\n| --- | --- | --- | --- | --- |")
    print(f"| bfloat16 | - | {toy['abstentions']['bfloat16']} / {toy['votes']} | - | - |")
    for name in list(VARIANTS)[1:]:
        real = result.get("real", {}).get(name)
        print(f"| {name} | {toy[name]['same_verdicts']}/{toy['votes']} ({toy[name]['agreement']:.2%}) | "
              f"{toy['abstentions'][name]} / {toy['votes']} | "
              + (f"{real['mean_kl']:.2e}, {real['max_kl']:.2e} | {real['top1_agreement']:.2%} |" if real else "- | - |"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


def main(argv) -> None:
    cli.no_arguments(argv)
    cli.exit_on_user_error(run)


if __name__ == "__main__":
    cli.start(main)
