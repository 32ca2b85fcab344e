import pytest

from builders.scoring.text_metrics import BertScorer, bleu_1, rouge_l

CANDIDATES = ["The heart is enlarged.", "No pleural effusion is seen.", "", "banana bread recipe"]
REFERENCES = [
    "The heart is enlarged.",
    "There is no pleural effusion.",
    "Clear lungs.",
    "Cardiomegaly with pulmonary edema.",
]


def test_rouge_l_and_bleu_1_bounds():
    rouge = rouge_l(CANDIDATES, REFERENCES)
    bleu = bleu_1(CANDIDATES, REFERENCES)
    assert rouge[0] == pytest.approx(1.0) and bleu[0] == pytest.approx(1.0)
    assert 0 < rouge[1] < 1 and 0 < bleu[1] < 1
    assert rouge[2] == 0 and bleu[2] == 0 and rouge[3] == 0 and bleu[3] == 0


@pytest.fixture(scope="module")
def scorer():
    return BertScorer(batch_size=3)


def _greedy_f1(scorer, candidate, reference):
    """BERTScore F1 of one pair, the slow obvious way, to check the batched code against."""
    import torch

    def tokens(text):
        emb, mask = scorer._embed([text])
        return torch.nn.functional.normalize(emb[0][mask[0]], dim=-1)

    with torch.inference_mode():
        c, r = tokens(candidate), tokens(reference)
    sim = c @ r.T
    precision, recall = sim.max(1).values.mean(), sim.max(0).values.mean()
    return float(2 * precision * recall / (precision + recall))


def test_bertscore_is_greedy_token_matching_f1(scorer):
    scores = scorer.score(CANDIDATES, REFERENCES)
    assert scores[0] == pytest.approx(1.0, abs=1e-5)
    assert scores[2] == 0.0
    assert scores[1] > scores[3]
    for i in (1, 3):
        assert scores[i] == pytest.approx(_greedy_f1(scorer, CANDIDATES[i], REFERENCES[i]), abs=1e-4)


def test_missing_extra_is_named(monkeypatch):
    import sys

    from builders.scoring.text_metrics import MissingExtraError

    monkeypatch.setitem(sys.modules, "rouge_score.rouge_scorer", None)
    with pytest.raises(MissingExtraError, match=r"from the cxr-vqa clone with: pip install '\.\[eval\]'"):
        rouge_l(["a"], ["a"])
