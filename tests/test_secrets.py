"""Keys and tokens never reach printed or logged text, checked against a real local server that echoes them."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from builders.scoring import evaluate
from builders.scoring.judge import ChatJudge, JudgeError
from builders.secrets import MaskSecrets, mask_secrets

JUDGE_KEY = "sk-echoedJudgeKey-0123456789abcdef"
HUB_TOKEN = "hf_localHubTokenValue0123456789"


class EchoHeaders(BaseHTTPRequestHandler):
    """Answers every request with its own headers, Authorization first, as a misconfigured proxy would."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {"Authorization": self.headers.get("Authorization"), **dict(self.headers)}
        body = json.dumps({"error": "not a chat endpoint", "received_headers": headers}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo_url(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", JUDGE_KEY)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    server = HTTPServer(("127.0.0.1", 0), EchoHeaders)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_judge_error_masks_the_echoed_key(echo_url):
    judge = ChatJudge(echo_url, "m", api_key_env="MY_JUDGE_KEY")
    with pytest.raises(JudgeError) as error:
        judge.complete("hello")
    message = str(error.value)
    assert "returned no chat completion" in message and "Bearer ***" in message
    assert JUDGE_KEY not in message and JUDGE_KEY[:12] not in message


def test_evaluate_prints_no_key(echo_url, tmp_path, capsys, caplog):
    from .test_evaluate import _gemex_dir, gemex_scoring, write_jsonl

    folder, rows = _gemex_dir(tmp_path, per_type=1)
    predictions = tmp_path / "pred.jsonl"
    write_jsonl(predictions, [(r["question_id"], gemex_scoring.reference_reply(r)) for r in rows])
    code = evaluate.main(["gemex", "--dataset", str(folder), "--predictions", str(predictions), "--text-metrics", "",
                          "--judge-url", echo_url, "--judge-model", "m", "--judge-api-key-env", "MY_JUDGE_KEY"])
    captured = capsys.readouterr()
    shown = captured.out + captured.err + caplog.text
    assert code == 2 and "Bearer ***" in captured.err
    assert JUDGE_KEY not in shown and HUB_TOKEN not in shown


def test_cli_error_lines_mask_tokens(monkeypatch, capsys, tmp_path):
    from builders.cli import main

    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    missing = tmp_path / f"build-{HUB_TOKEN}"  # a secret that reaches an error message by any road
    assert main(["build", "gemex", "--source", str(missing), "--out", str(tmp_path / "out"), "--image-mode", "none"]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path) in err and HUB_TOKEN not in err and "build-***: no such file" in err


def test_mask_secrets_forms(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "plain-key-without-prefix")
    text = "Authorization: Bearer abc.def-ghi; token hf_AbCdEf0123456789 and plain-key-without-prefix"
    assert mask_secrets(text) == "Authorization: Bearer ***; token hf_*** and ***"


def test_logged_messages_are_masked(monkeypatch, caplog):
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    logger = logging.getLogger("cxr_vqa.test_secrets")
    logger.addFilter(MaskSecrets())
    with caplog.at_level(logging.WARNING):
        logger.warning("upload failed with token %s", HUB_TOKEN)
    assert HUB_TOKEN not in caplog.text and "***" in caplog.text


@pytest.mark.parametrize("argv", [
    ["evaluate", "gemex", "--dataset", ".", "--baseline", "Bearer sk-pastedKey0123456789abcdef"],
    ["build", "gemex", "--source", ".", "--out", "x", "--num-proc", HUB_TOKEN],
    ["publish", ".", "--repo", "org/x", HUB_TOKEN],  # unrecognized arguments: ...
])
def test_argument_errors_mask_what_they_echo(argv, capsys, monkeypatch):
    """Argparse echoes the bad value; a key pasted into the wrong option never reaches the screen."""
    from builders.cli import main

    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "error:" in err
    assert HUB_TOKEN not in err and "pastedKey" not in err and "***" in err


def test_a_bugs_traceback_is_masked_too(capsys, monkeypatch):
    from builders import cli

    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)

    def broken(args):
        raise KeyError(f"Authorization: Bearer {JUDGE_KEY} and {HUB_TOKEN}")

    monkeypatch.setattr(cli, "run_validate", broken)
    assert cli.main(["validate", "."]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError" in err and JUDGE_KEY not in err and HUB_TOKEN not in err
