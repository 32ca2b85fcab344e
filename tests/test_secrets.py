"""Keys and tokens never reach printed or logged text, checked against a real local server that echoes them."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from builders.scoring.judge import ChatJudge, JudgeError
from builders.secrets import MaskSecrets, mask_secrets, mask_url
from cxr_vqa import evaluate

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
    from .test_evaluate import judged_gemex_argv

    code = evaluate.main(judged_gemex_argv(tmp_path, echo_url, "--judge-api-key-env", "MY_JUDGE_KEY"))
    captured = capsys.readouterr()
    shown = captured.out + captured.err + caplog.text
    assert code == 2 and "Bearer ***" in captured.err
    assert JUDGE_KEY not in shown and HUB_TOKEN not in shown


def test_cli_error_lines_mask_tokens(monkeypatch, capsys, tmp_path):
    from cxr_vqa.cli import main

    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    missing = tmp_path / f"build-{HUB_TOKEN}"  # a secret that reaches an error message by any road
    assert (
        main(["build", "gemex", "--source", str(missing), "--out", str(tmp_path / "out"), "--image-mode", "none"]) == 1
    )
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


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", ".", "--benchmark", "gemex", "--baseline", "Bearer sk-pastedKey0123456789abcdef"],
        ["build", "gemex", "--source", ".", "--out", "x", "--num-proc", HUB_TOKEN],
        ["publish", ".", "--repo", "org/x", HUB_TOKEN],  # unrecognized arguments: ...
    ],
)
def test_argument_errors_mask_what_they_echo(argv, capsys, monkeypatch):
    """Argparse echoes the bad value; a key pasted into the wrong option never reaches the screen."""
    from cxr_vqa.cli import main

    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "error:" in err
    assert HUB_TOKEN not in err and "pastedKey" not in err and "***" in err


def test_a_bugs_traceback_is_masked_too(capsys, monkeypatch):
    from cxr_vqa import cli

    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)

    def broken(args):
        raise KeyError(f"Authorization: Bearer {JUDGE_KEY} and {HUB_TOKEN}")

    monkeypatch.setattr(cli, "run_validate", broken)
    assert cli.main(["validate", "."]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError" in err and JUDGE_KEY not in err and HUB_TOKEN not in err


URL_PASSWORD, URL_KEY = "hunter2-url-password", "query-key-0123456789"


def _credentialed(url: str) -> str:
    """`url` (http://127.0.0.1:PORT/v1) with a user:password before the host and a key in the query."""
    return url.replace("http://", f"http://alice:{URL_PASSWORD}@") + f"?api_key={URL_KEY}"


def _shows_no_url_secret(text: str) -> bool:
    import base64

    basic = base64.b64encode(f"alice:{URL_PASSWORD}".encode()).decode()
    return URL_PASSWORD not in text and URL_KEY not in text and basic not in text


@pytest.mark.parametrize("where", ["echoing server", "unreachable", "bad port", "not http"])
def test_judge_url_credentials_never_shown(echo_url, tmp_path, capsys, caplog, where):
    """A key in --judge-url (`user:password@host`, `?api_key=`) is masked in every error evaluate prints."""
    from .test_evaluate import judged_gemex_argv

    url = {
        "echoing server": _credentialed(echo_url),
        "unreachable": _credentialed("http://127.0.0.1:9/v1"),
        "bad port": f"http://alice:{URL_PASSWORD}@127.0.0.1:port/v1?api_key={URL_KEY}",
        "not http": f"ftp://alice:{URL_PASSWORD}@127.0.0.1/v1?api_key={URL_KEY}",
    }[where]
    code = evaluate.main(judged_gemex_argv(tmp_path, url, "--judge-api-key-env", "NO_SUCH_KEY_ENV"))
    captured = capsys.readouterr()
    assert code == 2 and captured.err.count("\n") == 1 and "***" in captured.err
    assert _shows_no_url_secret(captured.out + captured.err + caplog.text)
    if where == "echoing server":  # the credentials went as basic authentication, echoed back and masked
        assert "Basic ***" in captured.err


def test_judge_url_credentials_go_as_basic_auth_and_are_saved_masked(tmp_path, capsys, monkeypatch):
    from http.server import HTTPServer

    from .test_evaluate import judged_gemex_argv
    from .test_judge import _FakeJudge

    server = HTTPServer(("127.0.0.1", 0), _FakeJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _FakeJudge.requests = []
    try:
        url = _credentialed(f"http://127.0.0.1:{server.server_address[1]}/v1")
        code = evaluate.main(
            judged_gemex_argv(
                tmp_path, url, "--judge-api-key-env", "NO_SUCH_KEY_ENV", "--out", str(tmp_path / "scores.json")
            )
        )
    finally:
        server.shutdown()
        server.server_close()
    captured = capsys.readouterr()
    assert code == 0 and _FakeJudge.requests
    import base64

    assert {r["auth"] for r in _FakeJudge.requests} == {
        "Basic " + base64.b64encode(f"alice:{URL_PASSWORD}".encode()).decode()
    }
    assert {r["path"] for r in _FakeJudge.requests} == {f"/v1/chat/completions?api_key={URL_KEY}"}
    saved = (tmp_path / "scores.json").read_text()
    assert (
        json.loads(saved)["settings"]["judge"]["url"]
        == f"http://***@127.0.0.1:{server.server_address[1]}/v1?api_key=***"
    )
    assert _shows_no_url_secret(saved + captured.out + captured.err)


def test_url_credentials_masked_in_any_text():
    text = (
        "GET https://bob:pa55word-x@hub.example/api?repo=x&token=tok123456&X-Amz-Signature=abc&keyword=kept; "
        "see http://plain.example/v1?api-version=2024 and mail bob@example.org"
    )
    assert mask_secrets(text) == (
        "GET https://***@hub.example/api?repo=x&token=***&X-Amz-Signature=***&keyword=kept; "
        "see http://plain.example/v1?api-version=2024 and mail bob@example.org"
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://judge.example/v1?authToken=SECRETVALUE1&model=m",
        "https://judge.example/v1?accessKey=SECRETVALUE1",
        "https://judge.example/v1?clientSecret=SECRETVALUE1",
        "https://judge.example/v1?sessionToken=SECRETVALUE1",
        "https://judge.example/v1?apiToken=SECRETVALUE1",
        "https://judge.example/v1?authtoken=SECRETVALUE1",
        "https://judge.example/v1?client_secret=SECRETVALUE1",
        "https://judge.example/callback#access_token=SECRETVALUE1&token_type=bearer",
        "https://judge.example/callback#state=x&id_token=SECRETVALUE1",
        "http://u:p@ssSECRETVALUE1@judge.example/v1",
    ],
)
def test_mask_url_key_spellings_fragments_and_at_signs(url):
    masked = mask_url(url)
    assert "SECRETVALUE1" not in masked and "***" in masked and "judge.example" in masked


def test_a_camel_case_key_in_the_judge_url_is_masked_in_evaluates_error(tmp_path, capsys):
    from .test_evaluate import judged_gemex_argv

    url = f"http://127.0.0.1:9/v1?authToken={URL_KEY}&clientSecret={URL_PASSWORD}"
    code = evaluate.main(judged_gemex_argv(tmp_path, url, "--judge-api-key-env", "NO_SUCH_KEY_ENV"))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "authToken=***" in err and _shows_no_url_secret(err)
