"""metrics.jsonl rows and TensorBoard event records (TFRecord framing, CRC32C, Event protos)."""

import json
import struct

import pytest

from rrc_jax.metrics import MetricsLogger, _masked_crc, crc32c


def read_records(path):
    data = path.read_bytes()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        assert struct.unpack("<I", data[i + 8:i + 12])[0] == _masked_crc(data[i:i + 8])
        payload = data[i + 12:i + 12 + n]
        assert struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == _masked_crc(payload)
        out.append(payload)
        i += 16 + n
    return out


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_jsonl_and_event_records(tmp_path):
    log = MetricsLogger(tmp_path)
    log.log(0, {"reward/mean": 0.5, "eval/oracle_quality": 0.25})
    log.log(3, {"reward/mean": 0.75, "name": "not a scalar", "nan": float("nan")})
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"step": 0, "reward/mean": 0.5, "eval/oracle_quality": 0.25}
    assert rows[1]["step"] == 3 and rows[1]["name"] == "not a scalar"
    (events,) = (tmp_path / "tensorboard").iterdir()
    records = read_records(events)
    assert len(records) == 3  # file_version + two summaries
    assert b"brain.Event:2" in records[0]
    assert b"reward/mean" in records[2] and struct.pack("<f", 0.75) in records[2] and b"nan" not in records[2]


def test_tensorboard_reads_the_events(tmp_path):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    log = MetricsLogger(tmp_path)
    for step in range(3):
        log.log(step, {"kl": step / 10})
    log.close()
    (events,) = (tmp_path / "tensorboard").iterdir()
    ea = accumulator.EventAccumulator(str(events))
    ea.Reload()
    assert [(e.step, round(e.value, 5)) for e in ea.Scalars("kl")] == [(0, 0.0), (1, 0.1), (2, 0.2)]


def test_a_resumed_run_drops_the_lines_logged_after_its_checkpoint(tmp_path):
    """Steps 0-3 logged, then the run resumes from the checkpoint of step 2: lines 0-2 stay, 3 is dropped; a run with
    no checkpoint yet (resume_step 0) starts the file again."""
    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(4):
        logger.log(step, {"loss": float(step)})
    logger.close()
    steps = lambda: [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    MetricsLogger(tmp_path, tensorboard=False, resume_step=2).close()
    assert steps() == [0, 1, 2]
    MetricsLogger(tmp_path, tensorboard=False, resume_step=0).close()
    assert steps() == []
