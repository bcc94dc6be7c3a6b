"""The judge with int8 weights (`reward.judge.weight_qtype=int8`: qwix, one scale per output channel, dequantized
a layer at a time in the decoder's scan) against the same judge in bfloat16.

    python benchmarks/int8_judge.py [--pairs=512 --real_questions=16 --seed=0]

- The toy world's judge: `--pairs` held-out pairs (the evaluation split's prompts, two sampled responses each,
  `rrc_jax.data.toy.task.sample_pair`), each judged once in each order, greedily, in the toy template; the share of
  votes whose verdict (A, B or none) is the same with both judges, and each judge's abstentions.
- The real model (SmolLM2-135M-Instruct, `rrc_jax.models.real_model`): the next-token distributions of both on
  `--real_questions` judge questions of the packaged chat prompts (the `rrc_pairwise_cot` template, two answers
  each): KL(bfloat16 || int8) per position, mean and largest, and how often their top-1 tokens agree.

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


def toy_judges():
    """The toy world's judge in bfloat16 and with int8 weights (bfloat16 compute), and its tokenizer."""
    from rrc_jax.config import base_config, validate
    from rrc_jax.models.hf_io import load_hf, load_tokenizer
    from rrc_jax.models.lora import frozen_base
    from rrc_jax.rl.roles import Roles

    path = Roles.of_run(validate(base_config("agr"))).path("grm")
    return (load_hf(path, dtype="bfloat16"), load_hf(path, dtype="bfloat16", lora=frozen_base("int8")),
            load_tokenizer(path))


def toy_agreement(pairs: int, seed: int) -> dict:
    """Greedy verdicts of both toy judges on `pairs` held-out pairs, each in both orders (module docstring)."""
    from rrc_jax.data.toy.task import SortTask, ToyTaskConfig, sample_pair
    from rrc_jax.inference import make_sampler
    from rrc_jax.judge import Judge, JudgeConfig

    bf16, int8, tok = toy_judges()
    task, rng = ToyTaskConfig().task, np.random.default_rng(seed)
    drawn = [sample_pair(task, rng, held_out=True) for _ in range(pairs)]
    prompts = [SortTask.prompt_text(d) for d, _, _ in drawn]
    asking = JudgeConfig(template="toy_pairwise_cot", max_new_tokens=24, temperature=0.0)
    verdicts = {}
    for name, model in (("bfloat16", bf16), ("int8", int8)):
        judge = Judge(make_sampler("grm", model, tok, max_batch=256), tok, asking)
        _, log = judge.explain(prompts, [a for _, a, _ in drawn], [b for _, _, b in drawn], votes=2, swap=True)
        verdicts[name] = np.asarray([v.winner for v in sorted(log, key=lambda v: (v.pair, v.vote))], object)
    same = verdicts["bfloat16"] == verdicts["int8"]
    return dict(pairs=pairs, votes=int(same.size), same_verdicts=int(same.sum()), agreement=float(same.mean()),
                abstentions={k: int((v == None).sum()) for k, v in verdicts.items()})  # noqa: E711


def real_kl(questions: int) -> dict:
    """KL(bfloat16 || int8) of the real model's next-token distributions on judge questions (module docstring)."""
    import jax
    import jax.numpy as jnp

    from rrc_jax.data.chat import chat_rows
    from rrc_jax.judge.templates import get_template
    from rrc_jax.models.hf_io import format_prompt, load_hf, load_tokenizer
    from rrc_jax.models.lora import frozen_base
    from rrc_jax.models.real_model import real_model_dir

    path = real_model_dir()
    tok, t = load_tokenizer(path), get_template("rrc_pairwise_cot")
    rows = chat_rows()[:questions]
    ids = []
    for row in rows:
        user = t.context.replace("{prompt}", row["prompt"]) + t.item.replace("{a}", row["answer"]).replace(
            "{b}", f"I am not sure; perhaps not {row['answer']}.")
        ids.append(tok(format_prompt(tok, user, t.system), add_special_tokens=False)["input_ids"])
    n = max(map(len, ids))
    batch = np.zeros((len(ids), n), np.int32)
    mask = np.zeros((len(ids), n), bool)
    for i, x in enumerate(ids):
        batch[i, :len(x)], mask[i, :len(x)] = x, True
    out = {}
    for name, lora in (("bfloat16", None), ("int8", frozen_base("int8"))):
        model = load_hf(path, dtype="bfloat16", lora=lora)
        out[name] = np.asarray(jax.nn.log_softmax(model(jnp.asarray(batch), jnp.asarray(mask)), axis=-1))
    p, q = out["bfloat16"][mask], out["int8"][mask]  # [positions, V] log-probs
    kl = (np.exp(p) * (p - q)).sum(axis=-1)
    return dict(questions=len(ids), positions=int(mask.sum()), mean_kl=float(kl.mean()), max_kl=float(kl.max()),
                top1_agreement=float((p.argmax(-1) == q.argmax(-1)).mean()))


def run() -> None:
    args = flags.FLAGS
    cli.check_at_least(1, "pairs")
    start = time.time()
    result = {"toy": toy_agreement(args.pairs, args.seed)}
    if args.real_questions:
        result["real"] = real_kl(args.real_questions)
    result["seconds"] = time.time() - start
    toy = result["toy"]
    print("| judge | figure |\n| --- | --- |")
    print(f"| toy, {toy['pairs']} held-out pairs x 2 orders, greedy | same verdict as bfloat16: "
          f"{toy['same_verdicts']}/{toy['votes']} ({toy['agreement']:.2%}); abstentions bf16 / int8: "
          f"{toy['abstentions']['bfloat16']} / {toy['abstentions']['int8']} |")
    if "real" in result:
        r = result["real"]
        print(f"| real, {r['questions']} judge questions, {r['positions']} positions | KL(bf16 || int8) mean "
              f"{r['mean_kl']:.2e}, largest {r['max_kl']:.2e}; top-1 agreement {r['top1_agreement']:.2%} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


def main(argv) -> None:
    cli.no_arguments(argv)
    cli.exit_on_user_error(run)


if __name__ == "__main__":
    cli.start(main)
