import json
import threading
import typing
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from builders.scoring.judge import ChatJudge, JudgeError, Judgement, judge_prompt, parse_scores, relative_score


class _FakeJudge(BaseHTTPRequestHandler):
    """Scores the reference 8 and the candidate 8 when it matches the reference, else 2; records requests."""

    requests: typing.ClassVar[list] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        prompt = body["messages"][-1]["content"]
        first = prompt.split("[The Start of Assistant 1's Answer]\n")[1].split("\n\n[The End")[0]
        second = prompt.split("[The Start of Assistant 2's Answer]\n")[1].split("\n\n[The End")[0]
        content = "unparseable" if "garble" in second else f"8 {8 if first == second else 2}\nBecause."
        reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture()
def judge_url():
    server = HTTPServer(("127.0.0.1", 0), _FakeJudge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakeJudge.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_judge_protocol_against_a_local_server(judge_url, monkeypatch):
    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-test")
    judge = ChatJudge(judge_url, "judge-model", api_key_env="TEST_JUDGE_KEY")
    same = judge.judge("Is there an effusion?", "Yes. Blunted angle.", "Yes. Blunted angle.")
    other = judge.judge("Is there an effusion?", "Yes. Blunted angle.", "No.")
    failed = judge.judge("Is there an effusion?", "Yes. Blunted angle.", "garble")
    assert same == Judgement(8, 8) and other == Judgement(8, 2) and failed is None
    request = _FakeJudge.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["body"]["model"] == "judge-model" and request["body"]["temperature"] == 0
    assert request["body"]["messages"][0]["role"] == "system"
    assert request["auth"] == "Bearer sk-test"
    score, failures = relative_score([same, other, failed])
    assert score == pytest.approx(100 * 10 / 16) and failures == 1


def test_unreachable_judge_is_a_clear_error():
    judge = ChatJudge("http://127.0.0.1:9/v1", "m", api_key_env=None, timeout=2)
    with pytest.raises(JudgeError, match=r"127\.0\.0\.1:9"):
        judge.judge("q", "a", "b")


def test_prompt_puts_reference_first():
    prompt = judge_prompt("Q?", "REF", "CAND")
    assert prompt.index("REF") < prompt.index("CAND") and "Assistant 1" in prompt


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("8 6\nexplanation", Judgement(8, 6)),
        ("7, 9", Judgement(7, 9)),
        ("\n 9.5 4 \n", Judgement(9.5, 4)),
        ("Score: 8", None),
        ("", None),
    ],
)
def test_parse_scores(reply, expected):
    assert parse_scores(reply) == expected
