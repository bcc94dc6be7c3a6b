"""Preference loaders (`rrc_jax.data.preferences`): each benchmark's schema, written here as tiny fixtures."""

import gzip
import json
import re

import datasets
import pytest

from rrc_jax.data.preferences import COUNTS, FORMATS, Preference, load_preferences
from rrc_jax.errors import ConfigError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def counts(**nonzero):
    return {**dict.fromkeys(COUNTS, 0), **nonzero}


SYSTEM_CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "2."},
    {"role": "user", "content": "Another?"},
]

HS3_ROWS = [
    # 0: plain-string context, response1 better, 3 annotators (two agree with the overall sign)
    {"domain": "general", "language": "english", "context": "What is 2+2?", "response1": "4", "response2": "5",
     "overall_preference": -2,
     "individual_preference": [{"score": -2, "reasoning": "1 is right."}, {"score": -1, "reasoning": "1, barely."},
                               {"score": 1, "reasoning": "I prefer 2."}]},
    # 1: a single user message, response2 better, 1 annotator with feedback fields
    {"domain": "code", "language": "english", "context": [{"role": "user", "content": "Sort [2, 1]."}],
     "response1": "[2, 1]", "response2": "[1, 2]", "overall_preference": 3,
     "individual_preference": [{"score": 3, "reasoning": "2 sorts.", "feedback1": "wrong", "feedback2": "ok"}]},
    # 2: a multi-turn conversation with a system message, no individual_preference at all
    {"domain": "general", "context": SYSTEM_CONVERSATION, "response1": "4.", "response2": "3.",
     "overall_preference": 1},
    # 3: a tie
    {"domain": "stem", "context": "Hi", "response1": "Hello", "response2": "Hey", "overall_preference": 0,
     "individual_preference": [{"score": 0, "reasoning": "Same."}]},
    # 4: weak, empty individual_preference
    {"domain": "stem", "context": "Why?", "response1": "Because.", "response2": "No.", "overall_preference": -1,
     "individual_preference": []},
    # 5: malformed: response2 missing
    {"domain": "stem", "context": "Broken", "response1": "x", "overall_preference": 2},
    # 6: strongest, 2 annotators (one disagrees, one scores 0: neither joins the rationale)
    {"domain": "multilingual", "context": "Bonjour?", "response1": "Salut", "response2": "Hallo",
     "overall_preference": -3,
     "individual_preference": [{"score": -3, "reasoning": "French."}, {"score": 2, "reasoning": "German."},
                               {"score": 0, "reasoning": "Either."}]},
]


@pytest.fixture
def hs3(tmp_path):
    return write_jsonl(tmp_path / "hs3.jsonl", HS3_ROWS)


def test_helpsteer3_fields_and_counts(hs3):
    got = load_preferences(hs3, "helpsteer3", skip_bad_rows=True)
    assert got.source == hs3
    assert got.counts == counts(rows=7, pairs=5, ties_dropped=1, bad_rows_skipped=1)
    p0, p1, p2, p4, p6 = got.prefs
    assert p0 == Preference("What is 2+2?", "4", "5", rationale="1 is right.\n\n1, barely.", strength=2,
                            key="hs3.jsonl:0", domain="general")
    assert p1 == Preference("Sort [2, 1].", "[1, 2]", "[2, 1]", rationale="2 sorts.", strength=3, key="hs3.jsonl:1",
                            domain="code")
    assert p2.prompt == "System: Be brief.\n\nUser: Name a prime.\n\nAssistant: 2.\n\nUser: Another?"
    assert (p2.chosen, p2.rejected, p2.rationale, p2.strength, p2.key) == ("3.", "4.", "", 1, "hs3.jsonl:2")
    assert (p4.chosen, p4.rejected, p4.rationale, p4.strength) == ("Because.", "No.", "", 1)
    assert (p6.chosen, p6.rationale, p6.strength, p6.key, p6.style) == ("Salut", "French.", 3, "hs3.jsonl:6", None)


def test_helpsteer3_min_strength_and_limit(hs3):
    got = load_preferences(hs3, "helpsteer3", skip_bad_rows=True, min_strength=2)  # IRPO's filter
    assert [p.key for p in got.prefs] == ["hs3.jsonl:0", "hs3.jsonl:1", "hs3.jsonl:6"]
    assert got.counts == counts(rows=7, pairs=3, ties_dropped=1, weak_dropped=2, bad_rows_skipped=1)
    got = load_preferences(hs3, "helpsteer3", limit=3)  # stops before the malformed row
    assert got.counts == counts(rows=3, pairs=3)


def test_malformed_row_names_file_row_and_field(hs3):
    with pytest.raises(ConfigError) as e:
        load_preferences(hs3, "helpsteer3")
    msg = str(e.value)
    assert msg.startswith(f"{hs3} row 5: field 'response2' is missing")
    assert "data.skip_bad_rows=True" in msg


@pytest.mark.parametrize("fmt,row,field", [
    ("helpsteer3", {**HS3_ROWS[0], "overall_preference": 5}, "overall_preference"),
    ("helpsteer3", {**HS3_ROWS[0], "response1": "  "}, "response1"),
    ("helpsteer3", {**HS3_ROWS[0], "context": SYSTEM_CONVERSATION[:3]}, "context"),
    ("helpsteer3", {**HS3_ROWS[0], "individual_preference": [{"reasoning": "no score"}]},
     "individual_preference[0].score"),
    ("rmbench", {"id": 1, "prompt": "p", "chosen": ["a", "b"], "rejected": ["x", "y", "z"]}, "chosen"),
    ("judgebench", {"pair_id": "q", "response_A": "a", "response_B": "b", "label": "A>B"}, "question"),
    ("pairs", {"prompt": "p", "chosen": "a", "rejected": "b", "strength": "high"}, "strength"),
])
def test_malformed_rows(tmp_path, fmt, row, field):
    good = {"helpsteer3": HS3_ROWS[1], "rmbench": RMBENCH_ROWS[0], "judgebench": JUDGEBENCH_ROWS[0],
            "pairs": PAIRS_ROWS[0]}[fmt]
    path = write_jsonl(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(ConfigError, match=rf"bad\.jsonl row 1: field '{re.escape(field)}'.*data\.skip_bad_rows=True"):
        load_preferences(path, fmt)
    got = load_preferences(path, fmt, skip_bad_rows=True)
    assert got.counts["rows"] == 2 and got.counts["bad_rows_skipped"] == 1
    assert {p.key for p in got.prefs} == {"bad.jsonl:0"}


RMBENCH_ROWS = [
    {"id": 7, "prompt": "Add 1+1.", "chosen": ["2", "It is 2.", "**2**"], "rejected": ["3", "It is 3.", "**3**"],
     "domain": "math"},
    {"id": 8, "prompt": "Say hi.", "chosen": ["hi", "Hi there.", "# Hi"], "rejected": ["no", "No way.", "# No"],
     "domain": "chat"},
]


def test_rmbench_nine_pairs_per_row(tmp_path):
    path = tmp_path / "total_dataset.json"
    path.write_text(json.dumps(RMBENCH_ROWS))  # a JSON list, as RM-Bench ships it
    got = load_preferences(str(path), "rmbench")
    assert got.counts == counts(rows=2, pairs=18)
    first = got.prefs[:9]
    assert [p.style for p in first] == [(i, j) for i in range(3) for j in range(3)]
    assert {p.key for p in first} == {"total_dataset.json:0"} and {p.domain for p in first} == {"math"}
    for p in got.prefs:
        row = RMBENCH_ROWS[int(p.key.rsplit(":", 1)[1])]
        assert (p.prompt, p.chosen, p.rejected, p.strength) == (row["prompt"], row["chosen"][p.style[0]],
                                                                row["rejected"][p.style[1]], 0)
    with pytest.raises(ConfigError, match="no strength"):
        load_preferences(str(path), "rmbench", min_strength=2)


JUDGEBENCH_ROWS = [
    {"pair_id": "a1", "original_id": "o1", "source": "mmlu-pro-math", "question": "Q1", "response_model": "m",
     "response_A": "right", "response_B": "wrong", "label": "A>B"},
    {"pair_id": "a2", "original_id": "o2", "question": "Q2", "response_model": "m", "response_A": "wrong",
     "response_B": "right", "label": "B>A"},
    {"pair_id": "a3", "original_id": "o3", "source": "livebench", "question": "Q3", "response_model": "m",
     "response_A": "same", "response_B": "same too", "label": "A=B"},
]


def test_judgebench_labels(tmp_path):
    got = load_preferences(write_jsonl(tmp_path / "judgebench.jsonl", JUDGEBENCH_ROWS), "judgebench")
    assert got.counts == counts(rows=3, pairs=2, labels_dropped=1)
    assert got.prefs == [
        Preference("Q1", "right", "wrong", key="judgebench.jsonl:0", domain="mmlu-pro-math"),
        Preference("Q2", "right", "wrong", key="judgebench.jsonl:1", domain=""),
    ]


PAIRS_ROWS = [
    {"prompt": "p0", "chosen": "c0", "rejected": "r0", "rationale": "because", "strength": 2, "domain": "d"},
    {"prompt": "p1", "chosen": "c1", "rejected": "r1"},
]
PAIRS_PREFS = [("p0", "c0", "r0", "because", 2, "d"), ("p1", "c1", "r1", "", 0, "")]


def fields(prefs):
    return [(p.prompt, p.chosen, p.rejected, p.rationale, p.strength, p.domain) for p in prefs]


def test_pairs_every_source_kind(tmp_path):
    jsonl = write_jsonl(tmp_path / "pairs.jsonl", PAIRS_ROWS)
    parquet = str(tmp_path / "pairs.parquet")
    datasets.Dataset.from_list(PAIRS_ROWS).to_parquet(parquet)
    gz = tmp_path / "pairs.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in PAIRS_ROWS))
    saved = str(tmp_path / "saved")
    datasets.Dataset.from_list(PAIRS_ROWS).save_to_disk(saved)
    for path, name in [(jsonl, "pairs.jsonl"), (parquet, "pairs.parquet"), (str(gz), "pairs.jsonl.gz"),
                       (saved, "saved")]:
        got = load_preferences(path, "pairs")
        assert fields(got.prefs) == PAIRS_PREFS, path
        assert [p.key for p in got.prefs] == [f"{name}:0", f"{name}:1"]
        assert got.counts == counts(rows=2, pairs=2)
    got = load_preferences(jsonl, "pairs", min_strength=1)
    assert got.counts == counts(rows=2, pairs=1, weak_dropped=1)


def test_saved_dataset_dict_takes_the_split(tmp_path):
    folder = str(tmp_path / "dd")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(PAIRS_ROWS),
                          "validation": datasets.Dataset.from_list(PAIRS_ROWS[1:])}).save_to_disk(folder)
    got = load_preferences(folder, "pairs", split="validation")
    assert fields(got.prefs) == PAIRS_PREFS[1:] and got.prefs[0].key == "dd[validation]:0"
    with pytest.raises(ConfigError, match="train, validation"):
        load_preferences(folder, "pairs", split="test")


def test_hub_name_goes_to_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(name, *args, **kwargs):
        calls.append((name, args, kwargs))
        return datasets.Dataset.from_list(JUDGEBENCH_ROWS[:1])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    got = load_preferences("ScalerLab/JudgeBench", "judgebench", split="gpt")
    assert calls == [("ScalerLab/JudgeBench", (), {"split": "gpt"})]
    assert got.source == "ScalerLab/JudgeBench" and got.prefs[0].key == "ScalerLab/JudgeBench[gpt]:0"


def test_unknown_format_and_missing_file(tmp_path, hs3):
    with pytest.raises(ConfigError, match="helpsteer3, rmbench, judgebench, pairs"):
        load_preferences(hs3, "hh-rlhf")
    assert FORMATS == ("helpsteer3", "rmbench", "judgebench", "pairs")
    missing = str(tmp_path / "data" / "hs3.jsonl")
    with pytest.raises(ConfigError, match=f"{missing} does not exist"):
        load_preferences(missing, "helpsteer3")
    with pytest.raises(ConfigError, match="data/hs3.jsonl does not exist"):  # looks like org/name, but a file
        load_preferences("data/hs3.jsonl", "helpsteer3")
