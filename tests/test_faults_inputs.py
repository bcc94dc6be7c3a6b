"""Inputs a user (or a full disk) gets wrong: each is one `error:` line naming the thing and the fix, a resume that
goes on, or a non-zero exit instead of a score computed from nothing.

- more held-out toy prompts than the evaluation split has (a draw that never ended);
- a torn last line of `metrics.jsonl`, a data file that is not UTF-8 or holds only blank lines, a judge
  template file whose fields have the wrong type, `python -m rrc_jax.judge --votes=0`;
- `evaluate_rm` on a judge whose context no question fits with `--max_new_tokens`, and on a judge whose every
  vote abstains;
- a tokenizer whose ids reach past the model's vocabulary, settings that cannot work (PRC with a served judge, an
  inference mesh that does not span the devices, a LoRA rank above a projection's side, a size in config.json
  that is not a number), and more prompts per step than the training set holds.
"""

import contextlib
import gzip
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from flax import nnx

from conftest import make_hf_model
from test_bad_rows import file_config
from rrc_jax.config import base_config, validate
from rrc_jax.data.preferences import load_preferences
from rrc_jax.data.prompts import load_prompts
from rrc_jax.errors import ConfigError
from rrc_jax.metrics import MetricsLogger
from rrc_jax.models import Decoder, DecoderConfig, save_hf
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.sharding import model_context

ROOT = Path(__file__).resolve().parents[1]
TOK = make_char_tokenizer()


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The `error: ...` line a command line ended with (non-zero exit, no traceback)."""
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), proc.stderr[-2000:]
    return last


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


@contextlib.contextmanager
def no_hang(seconds: int = 120):
    """Fail (TimeoutError) instead of hanging the suite when the code under test never returns (a hang is the bug
    these tests pin down); generous: nothing here takes more than a few seconds."""
    def expire(signum, frame):
        raise TimeoutError(f"did not return within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------------------------------------
# Held-out toy prompts beyond the evaluation split
# ------------------------------------------------------------------------------------------------------------

def test_held_out_prompt_count_is_the_number_of_evaluation_split_strings():
    from rrc_jax.data.toy.task import held_out_prompt_count, is_held_out

    def brute(lo, hi):
        return sum(is_held_out(f"{i:0{n}d}") for n in range(lo, hi + 1) for i in range(10 ** n))

    for lo, hi in ((1, 1), (2, 3), (4, 6)):
        assert held_out_prompt_count(lo, hi) == brute(lo, hi)
    assert held_out_prompt_count(4, 6) == 138_750  # the toy world's default lengths


def toy_config(**toy):
    config = base_config("agr")
    with config.unlocked():
        config.toy.update(toy)
    return config


def test_toy_eval_prompts_beyond_the_split_is_one_line_error_naming_the_maximum():
    config = toy_config()
    config.data.eval_prompts = 1_000_000
    with no_hang(), pytest.raises(ConfigError, match=r"config.data.eval_prompts=1000000: the toy task has only "
                                                     r"138750 distinct held-out prompts .*<= 138750") as e:
        load_prompts(validate(config).prompts)
    assert "\n" not in str(e.value)


def test_toy_eval_prompts_up_to_the_maximum_are_drawn():
    config = toy_config(min_len=2, max_len=2, train_prompts=8)  # 100 strings of 2 digits, 12 of them held out
    config.data.eval_prompts = 13
    with no_hang(), pytest.raises(ConfigError, match=r"only 12 distinct held-out prompts"):
        load_prompts(validate(config).prompts)
    config.data.eval_prompts = 12
    with no_hang():
        _, held = load_prompts(validate(config).prompts)
    assert len(set(held.texts)) == 12


# ------------------------------------------------------------------------------------------------------------
# A torn metrics line
# ------------------------------------------------------------------------------------------------------------

def metrics_rows(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("torn", [b'{"step": 3, "reward/me', b'{"step": 3, "re\x00\x00\xe2\x82'])
def test_resume_drops_a_torn_last_metrics_line_and_goes_on(tmp_path, capsys, torn):
    """A full disk cut the write of step 3's line; the run resumes from step 2's checkpoint."""
    lines = b"".join(json.dumps({"step": s, "reward/mean": s / 10}).encode() + b"\n" for s in range(3))
    (tmp_path / "metrics.jsonl").write_bytes(lines + torn)
    logger = MetricsLogger(tmp_path, tensorboard=False, resume_step=2)
    logger.log(3, {"reward/mean": 0.3})
    logger.close()
    assert metrics_rows(tmp_path) == [{"step": s, "reward/mean": s / 10} for s in range(4)]
    assert "dropped the torn last line" in capsys.readouterr().err


def test_a_malformed_metrics_line_before_the_last_is_one_line_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "lo\n{"step": 2}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2: not a metrics line .*delete that line") as e:
        MetricsLogger(tmp_path, tensorboard=False, resume_step=2)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------------------
# Data files that are not UTF-8, or blank
# ------------------------------------------------------------------------------------------------------------

def write_bytes(path: Path, lines: list[bytes]) -> Path:
    """`lines` each ending in a newline (none: an empty file), gzipped for a `.gz` path."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    return path


def prompt_lines(bad_at: int = 2, n: int = 6) -> list[bytes]:
    """JSON lines of prompts `k 2 1`, line `bad_at + 1` holding bytes that are not UTF-8."""
    lines = [json.dumps({"prompt": f"{k} 2 1"}).encode() for k in range(n)]
    lines[bad_at] = b'{"prompt": "caf\xe9 \xff"}'  # Latin-1, not UTF-8
    return lines


@pytest.mark.parametrize("name", ["p.jsonl", "p.jsonl.gz"])
def test_invalid_utf8_in_a_prompt_file_names_file_and_line_and_can_be_skipped(tmp_path, name, capsys):
    config = file_config(write_bytes(tmp_path / name, prompt_lines()))
    with pytest.raises(ConfigError, match=rf"{name}:3: malformed JSON line \(not UTF-8: .*skip_bad_rows") as e:
        load_prompts(validate(config).prompts)
    assert "\n" not in str(e.value)
    with config.unlocked():
        config.data["skip_bad_rows"] = True
    train, _ = load_prompts(validate(config).prompts)
    assert train.texts == [f"{k} 2 1" for k in range(6) if k != 2]
    assert train.counts["bad_rows_skipped"] == 1
    assert f"skipped 1 malformed JSON lines of {name} ({name}:3: not UTF-8" in capsys.readouterr().err


def test_invalid_utf8_in_a_preference_file_names_file_and_line_and_can_be_skipped(tmp_path):
    rows = [json.dumps({"prompt": f"{k} 1", "chosen": "1", "rejected": "2"}).encode() for k in range(4)]
    rows[1] = b'{"prompt": "\xff", "chosen": "1", "rejected": "2"}'
    path = write_bytes(tmp_path / "prefs.jsonl", rows)
    with pytest.raises(ConfigError, match=r"prefs.jsonl:2: malformed JSON line \(not UTF-8"):
        load_preferences(str(path), "pairs")
    loaded = load_preferences(str(path), "pairs", skip_bad_rows=True)
    assert [p.prompt for p in loaded.prefs] == ["0 1", "2 1", "3 1"] and loaded.counts["bad_rows_skipped"] == 1


def test_invalid_utf8_in_csv_or_a_json_document_names_its_line(tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_bytes(b"prompt\n1 2\ncaf\xe9\n")
    with pytest.raises(ConfigError, match=r"p.csv:3: not UTF-8.*save the file as UTF-8"):
        load_prompts(validate(file_config(csv)).prompts)
    doc = tmp_path / "p.json"
    doc.write_bytes(b'[{"prompt": "a"},\n {"prompt": "caf\xe9"}]\n')
    with pytest.raises(ConfigError, match=r"p.json:2: malformed JSON \(not UTF-8"):
        load_prompts(validate(file_config(doc)).prompts)


@pytest.mark.parametrize("name", ["blank.jsonl", "blank.json", "blank.jsonl.gz", "empty.jsonl"])
def test_a_data_file_of_blank_lines_is_one_line_error(tmp_path, name):
    path = write_bytes(tmp_path / name, [b"", b"  ", b""] if name.startswith("blank") else [])
    with pytest.raises(ConfigError, match=rf"{name}: no rows \(the file is empty or only blank lines\)") as e:
        load_prompts(validate(file_config(path)).prompts)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=rf"{name}: no rows"):
        load_preferences(str(path), "pairs")


def test_a_file_whose_every_line_is_skipped_is_one_line_error(tmp_path):
    path = write_bytes(tmp_path / "p.jsonl", [b'{"prompt": "\xff"}', b"", b'{"prompt": '])
    with pytest.raises(ConfigError, match=r"p.jsonl: every line is malformed \(line 1: not UTF-8"):
        load_prompts(validate(file_config(path, skip_bad_rows=True)).prompts)


def test_evaluate_rm_names_the_line_that_is_not_utf8(tmp_path):
    rows = [json.dumps({"prompt": "1", "chosen": "1", "rejected": "2"}).encode(), b'{"prompt": "\xff"}']
    path = write_bytes(tmp_path / "prefs.jsonl", rows)
    line = one_error_line(run_module("rrc_jax.evaluate_rm", f"--model={tmp_path / 'none'}", f"--data={path}",
                                     "--format=pairs"))
    assert "prefs.jsonl:2: malformed JSON line (not UTF-8" in line and "skip_bad_rows" in line


# ------------------------------------------------------------------------------------------------------------
# Judge template fields of the wrong type, judge --votes=0
# ------------------------------------------------------------------------------------------------------------

TEMPLATE_FILES = {
    "context.yaml": ('kind: pairwise\ncontext: 123\nitem: "A: {a} B: {b}"\nthink: true\n',
                     r"context must be a string holding '\{prompt\}', got 123"),
    "item.yaml": ('kind: pairwise\ncontext: "Q: {prompt}"\nitem:\nthink: true\n',
                  r"item must be a string holding the responses .*, got None"),
    "think.json": ('{"kind": "pairwise", "context": "Q: {prompt}", "item": "{a} {b}", "think": "yes"}',
                   r"think must be true or false, got 'yes'"),
    "direct.json": ('{"kind": "pairwise", "context": "Q: {prompt}", "item": "{a} {b}", "think": true, '
                    '"direct": {"kind": "pairwise", "context": "Q: {prompt}", "item": ["{a}"], "think": false}}',
                    r"item must be a string"),
}


@pytest.mark.parametrize("name", sorted(TEMPLATE_FILES))
def test_template_fields_of_the_wrong_type_are_one_line_errors(tmp_path, name):
    from rrc_jax.judge import get_template

    text, message = TEMPLATE_FILES[name]
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=rf"judge template \S*{name}( \(direct\))?: {message}") as e:
        get_template(str(tmp_path / name))
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    """A tiny random Hugging Face judge with the character tokenizer (256-token context)."""
    path = tmp_path_factory.mktemp("judge_model")
    make_hf_model("qwen2_tied", seed=4, vocab_size=112).save_pretrained(path)
    TOK.save_pretrained(path)
    return path


def test_judge_cli_template_of_the_wrong_type_is_one_line(judge_dir, tmp_path):
    (tmp_path / "t.yaml").write_text(TEMPLATE_FILES["context.yaml"][0])
    line = one_error_line(run_module("rrc_jax.judge", f"--model={judge_dir}", "--prompt=3 1", "--a=1 3",
                                     "--b=3 1", f"--template={tmp_path / 't.yaml'}"))
    assert "t.yaml: context must be a string" in line


def test_judge_cli_zero_votes_is_one_line(judge_dir):
    line = one_error_line(run_module("rrc_jax.judge", f"--model={judge_dir}", "--prompt=3 1", "--a=1 3", "--b=3 1",
                                     "--template=toy_pairwise_cot", "--votes=0"))
    assert line.startswith("error: --votes=0") and "--votes=1 or more" in line


# ------------------------------------------------------------------------------------------------------------
# A score computed from nothing
# ------------------------------------------------------------------------------------------------------------

def test_fit_judgment_budget():
    from rrc_jax.rm.accuracy import fit_judgment_budget

    assert fit_judgment_budget(512, None, [40, 60]) == (512, None)  # context unknown: unchecked
    assert fit_judgment_budget(16, 256, [40, 60]) == (16, None)
    assert fit_judgment_budget(230, 256, [20, 240]) == (230, None)  # some question fits: the long one abstains
    budget, note = fit_judgment_budget(512, 256, [40, 60])
    assert budget == 196 and "--max_new_tokens=512" in note and "--max_new_tokens=196" in note and "256" in note
    with pytest.raises(ConfigError, match=r"--max_new_tokens=512: no question fits the judge's 64-token context.*"
                                          r"longest \(80 tokens\).*lower --max_new_tokens to at most 4"):
        fit_judgment_budget(512, 64, [60, 80])
    with pytest.raises(ConfigError, match=r"--max_new_tokens=8: .*longest \(70 tokens\)"):
        fit_judgment_budget(8, 64, [64, 70])


def test_nothing_scored():
    from rrc_jax.rm.accuracy import nothing_scored

    assert nothing_scored("pairwise", {"examples": 3, "votes": 2, "abstain_rate": 1.0}, []) == \
        "all 12 judge votes abstained"
    assert nothing_scored("pointwise", {"examples": 3, "votes": 1, "abstain_rate": 0.5}, []) is None
    nan = float("nan")
    assert "NaN or infinite" in nothing_scored("drm", {}, [{"score_chosen": nan, "score_rejected": nan}])
    assert nothing_scored("drm", {}, [{"score_chosen": nan, "score_rejected": 0.1}]) is None


@pytest.fixture(scope="module")
def short_judge(tmp_path_factory):
    """(a tiny random judge of a 64-token context, a file of 2 pairs): no toy question fits it with the default
    `--max_new_tokens=512`, as the toy GRM's 256 tokens."""
    path = tmp_path_factory.mktemp("short_judge")
    cfg = DecoderConfig(model_type="llama", vocab_size=len(TOK), hidden_size=16, intermediate_size=32, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=8, eos_token_ids=(2,), pad_token_id=0,
                        max_position_embeddings=64)
    with model_context(None):
        save_hf(Decoder(cfg, rngs=nnx.Rngs(3)), path / "judge", tokenizer=TOK)
    data = path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in (
        {"prompt": "3 1 2", "chosen": "1 2 3", "rejected": "3 2 1"},
        {"prompt": "2 1", "chosen": "1 2", "rejected": "2 1"})))
    return path / "judge", data


def test_evaluate_rm_fits_the_judgment_to_the_context_and_reports_no_score_from_abstentions(short_judge, tmp_path,
                                                                                              capsys):
    from rrc_jax.evaluate_rm import Args, run

    judge, data = short_judge
    dump, out = tmp_path / "verdicts.jsonl", tmp_path / "result.json"
    with pytest.raises(ConfigError, match=r"all 4 judge votes abstained \(0 did not fit the judge's 64-token "
                                          r"context .*: no score to report") as e:
        run(Args(model=str(judge), data=str(data), format="pairs", template="toy_pairwise_cot", dump=str(dump),
                 out=str(out)))
    assert "\n" not in str(e.value)
    captured = capsys.readouterr()
    assert "judge: no question fits the judge's 64-token context with --max_new_tokens=512; judging with " \
           "--max_new_tokens=" in captured.err
    assert "accuracy" not in captured.out and not out.exists()
    judgments = [j for line in dump.read_text().splitlines() for j in json.loads(line)["judgments"]]
    assert len(judgments) == 4 and all(j["text"] for j in judgments)  # asked (fitted), not skipped as too long


def test_evaluate_rm_command_exits_non_zero_instead_of_a_score_from_nothing(short_judge):
    judge, data = short_judge
    proc = run_module("rrc_jax.evaluate_rm", f"--model={judge}", f"--data={data}", "--format=pairs",
                      "--template=toy_pairwise_cot")
    line = one_error_line(proc)
    assert line.startswith("error: all 4 judge votes abstained") and "--max_new_tokens" in line
    assert "| accuracy |" not in proc.stdout


def test_a_tokenizer_id_beyond_the_vocabulary_is_one_line_wherever_the_model_loads(tmp_path, toy_cache,
                                                                                  short_judge):
    """The toy GRM copied with a tokenizer that maps "9" to 40 (still 36 tokens; the model has 36 ids): loading it as
    `models.grm`, in `serve`, `judge`, `generate` and `evaluate_rm`, is one line naming the largest id."""
    import shutil

    from conftest import tiny_config
    from test_openai_engine import free_port

    from rrc_jax.rl.roles import Roles
    from rrc_jax.rl.trainer import run

    bad = tmp_path / "grm"
    shutil.copytree(Roles.of_run(validate(tiny_config("scr", "unused", toy_cache))).path("grm"), bad)
    spec = json.loads((bad / "tokenizer.json").read_text())
    spec["model"]["vocab"]["9"] = 40
    (bad / "tokenizer.json").write_text(json.dumps(spec))
    said = (f"{bad}: the tokenizer's largest id is 40 (36 ids) but the model's vocabulary (config.json vocab_size) "
            "holds 36; ids >= 36 have no embedding: pair the model with its own tokenizer")
    with pytest.raises(ConfigError) as e:
        run(validate(tiny_config("scr", tmp_path / "run", toy_cache, **{"models.grm": str(bad)})))
    assert str(e.value) == said
    _, data = short_judge
    procs = [subprocess.Popen([sys.executable, "-m", module, f"--model={bad}", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for module, args in (("rrc_jax.serve", [f"--port={free_port()}"]),
                                  ("rrc_jax.judge", ["--prompt=1", "--a=1", "--b=2"]), ("rrc_jax.generate", ["--prompt=1"]),
                                  ("rrc_jax.evaluate_rm", [f"--data={data}", "--format=pairs"]))]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err)) == f"error: {said}"


def test_settings_that_cannot_work_are_refused_before_anything_loads(tmp_path, toy_cache):
    """PRC with a served judge, an inference mesh that does not span the devices (in training, on 1 device, and in
    the planner), a LoRA rank above a projection's smaller side, and a config.json with a string for a size: each
    one line, before a weight is read. A mesh message never asks to set -1 where one already is."""
    from conftest import tiny_config

    from rrc_jax import plan
    from rrc_jax.config import validate
    from rrc_jax.models.hf_io import read_hf_config
    from rrc_jax.rl.roles import Roles
    from rrc_jax.rl.trainer import run
    from rrc_jax.sharding import mesh_shape

    prc = tiny_config("prc", tmp_path / "prc", toy_cache, **{"inference.engine": "openai",
                                                            "inference.url": "http://127.0.0.1:9"})
    with pytest.raises(ConfigError, match=r"^config.inference.engine: 'openai' cannot give PRC's P\(A\): it reads "
                                          r"the log-probs of the verdict tokens"):
        validate(prc)

    loaded = []
    real = Roles.model
    Roles.model = lambda self, role: loaded.append(role) or real(self, role)
    try:
        with pytest.raises(ConfigError, match=r"^config.mesh.inference data=3 fsdp=3 tensor=3 needs 27 devices, but "
                                              r"1 are available"):
            run(validate(tiny_config("scr", tmp_path / "mesh", toy_cache, **{"mesh.inference": "3,3,3"})))
        with pytest.raises(ConfigError, match=r"^config.policy.lora.rank: 200 exceeds the smaller side of .*'s q "
                                              r"projection \(64 x 64\); use a rank <= 32"):
            run(validate(tiny_config("scr", tmp_path / "lora", toy_cache, **{"policy.lora.rank": 200})))
    finally:
        Roles.model = real
    assert loaded == ["policy"]  # the LoRA run asked for the policy, and was refused before load_hf

    c = base_config("agr")
    c.mesh.inference = "3,3,3"
    with pytest.raises(ConfigError, match=r"config.mesh.inference data=3 fsdp=3 tensor=3 needs 27 devices, but 32 are "
                                          r"in the training mesh; make their product 32"):
        plan.plan(validate(c), "v5p-64")
    c.mesh.inference, c.policy.lora.rank = "auto", 5000
    with pytest.raises(ConfigError, match="config.policy.lora.rank: 5000 exceeds the smaller side"):
        plan.plan(validate(c), "v5p-64")

    with pytest.raises(ConfigError) as e:
        mesh_shape(3, -1, 3, 8)
    assert str(e.value) == ("mesh data=3 fsdp=-1 tensor=3: the -1 axis takes the devices the others leave, but their "
                            "product 9 does not divide the 8 devices; make it a divisor of 8")

    make_hf_model("llama3_untied").save_pretrained(tmp_path / "two")
    hf = json.loads((tmp_path / "two" / "config.json").read_text())
    (tmp_path / "two" / "config.json").write_text(json.dumps({**hf, "num_hidden_layers": "two"}))
    with pytest.raises(ConfigError) as e:
        read_hf_config(tmp_path / "two")
    assert str(e.value) == (f"{tmp_path / 'two' / 'config.json'}: num_hidden_layers is 'two', not an integer >= 1; fix "
                            "the file (a Hugging Face config.json gives sizes as JSON numbers)")
    line = one_error_line(run_module("rrc_jax.generate", f"--model={tmp_path / 'two'}", "--prompt=hi"))
    assert line == f"error: {e.value}"


def test_more_prompts_per_step_than_prompts_says_they_repeat(tmp_path, toy_cache, capsys):
    from conftest import tiny_config

    from rrc_jax.rl.trainer import Trainer

    Trainer(validate(tiny_config("drm", tmp_path, toy_cache, **{"toy.train_prompts": 2, "rl.minibatch_size": 4})))
    assert ("warning: rl.prompts_per_step=4 but the training set holds 2 prompts: prompts repeat within a step"
            in capsys.readouterr().err)
