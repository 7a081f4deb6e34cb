"""Logs: readable lines by default, valid JSON lines when asked, libraries kept at WARNING."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from xmc.logs import JsonLinesFormatter, TextFormatter, kv


def _record(msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord("xmc.trainer.trainer", logging.INFO, __file__, 1, msg, args, None)


def test_json_lines_stay_valid_with_quotes_newlines_and_values():
    line = JsonLinesFormatter("train dexml").format(_record('say "hi"\nthen: %s', kv({"P@1": 68.61234, "n": 3})))
    rec = json.loads(line)
    assert "\n" not in line and rec["message"] == 'say "hi"\nthen: P@1 68.61, n 3'
    assert rec["level"] == "INFO" and rec["stage"] == "train dexml" and rec["logger"] == "xmc.trainer.trainer"


def test_text_lines_name_level_and_stage_without_reprs():
    line = TextFormatter("evaluate astra").format(_record("metrics: %s", kv({"P@1": 70.5, "R@100": 61.0})))
    assert line.endswith("INFO    evaluate astra | metrics: P@1 70.5, R@100 61") and "{" not in line


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_stage_logs_in_the_chosen_format_and_quiets_libraries(fmt, tmp_path):
    code = ("import logging; from xmc.logs import setup_logging; setup_logging(); "
            "logging.getLogger('stages.x').info('hello \"there\"'); logging.getLogger('transformers').info('chatter'); "
            "g = logging.getLogger('great_expectations.data_context'); g.setLevel(logging.INFO); g.info('chatter'); "
            "logging.getLogger('faiss.loader').warning('kept')")
    import os

    env = {**os.environ, "XMC_LOG_FORMAT": fmt}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 2 and "chatter" not in p.stderr          # library INFO dropped, its WARNING kept
    if fmt == "json":
        assert [json.loads(x)["message"] for x in lines] == ['hello "there"', "kept"]
    else:
        assert lines[0].split(" ", 1)[1].startswith("INFO") and lines[0].endswith('| hello "there"')


def test_prefect_stage_progress_is_logged_at_a_bounded_rate(monkeypatch):
    """tqdm redraws of a stage reach the flow log at most once per PROGRESS_EVERY_S, plus each bar's 100 %."""
    import flows.dvc_tasks as dt

    now = [0.0]
    monkeypatch.setattr(dt.time, "monotonic", lambda: now[0])
    shown = []
    monkeypatch.setattr(dt.StageProgress, "_artifact", lambda self, pct, line: shown.append(pct))
    prog = dt.StageProgress("train@astra", every_s=30)
    kept = []
    for i in range(1, 101):                      # 100 redraws over 200 s
        now[0] = 2.0 * i
        line = f"epoch 1/6:  {i:3d}%|####| {i}/100 [00:{i:02d}<00:10, 5.0step/s]"
        if prog.due(line):
            kept.append(i)
    assert kept[0] == 1 and kept[-1] == 100 and len(kept) <= 200 / 30 + 2
    assert all(b - a >= 15 for a, b in zip(kept[:-2], kept[1:-1]))   # 30 s apart = 15 redraws
    assert shown == [float(i) for i in kept]     # the progress artifact follows the logged lines
    # outside a flow run the artifact call fails quietly and the line is still logged
    monkeypatch.undo()
    assert dt.StageProgress("x").due("epoch 1/1: 100%|####| 1/1")
